from console.api_router import api_router
from console.gateway.api.views import ApiKeyViewSet, ModelAliasViewSet

router = api_router()
router.register("keys", ApiKeyViewSet, basename="apikey")
router.register("aliases", ModelAliasViewSet, basename="modelalias")
urlpatterns = router.urls
