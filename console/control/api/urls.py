from console.api_router import api_router
from console.control.api.views import DeploymentViewSet

# Its root view answers /api/v1/ itself.
router = api_router(root_view=True)
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
