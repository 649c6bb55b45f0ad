from rest_framework.routers import DefaultRouter

from console.catalog.api.views import BaseModelViewSet, QuantizationJobViewSet, VariantViewSet

router = DefaultRouter()
router.trailing_slash = "/?"
router.include_root_view = False
router.register("models", BaseModelViewSet, basename="basemodel")
router.register("variants", VariantViewSet, basename="variant")
router.register("quantization-jobs", QuantizationJobViewSet, basename="quantizationjob")
urlpatterns = router.urls
