from console.api_router import api_router
from console.catalog.api.views import BaseModelViewSet, VariantViewSet

router = api_router()
router.register("models", BaseModelViewSet, basename="basemodel")
router.register("variants", VariantViewSet, basename="variant")
urlpatterns = router.urls
