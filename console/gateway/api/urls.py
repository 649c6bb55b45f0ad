from console.api_router import api_router
from console.gateway.api.views import ApiKeyViewSet

router = api_router()
router.register("keys", ApiKeyViewSet, basename="apikey")
urlpatterns = router.urls
