from rest_framework.routers import DefaultRouter

from console.deployments.api.views import DeploymentViewSet

router = DefaultRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
