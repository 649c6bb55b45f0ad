from rest_framework.routers import DefaultRouter

from console.fleet.api.views import NodeViewSet

router = DefaultRouter()
router.trailing_slash = "/?"
router.include_root_view = False
router.register("nodes", NodeViewSet, basename="node")
urlpatterns = router.urls
