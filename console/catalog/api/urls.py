from console.api_router import api_router
from console.catalog.api.views import BaseModelViewSet, QuantizationJobViewSet, VariantViewSet

router = api_router()
router.register("models", BaseModelViewSet, basename="basemodel")
router.register("variants", VariantViewSet, basename="variant")
router.register("quantization-jobs", QuantizationJobViewSet, basename="quantizationjob")
urlpatterns = router.urls
