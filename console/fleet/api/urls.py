from console.api_router import api_router
from console.fleet.api.views import NodeViewSet

router = api_router()
router.register("nodes", NodeViewSet, basename="node")
urlpatterns = router.urls
