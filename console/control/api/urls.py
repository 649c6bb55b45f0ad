from rest_framework.routers import DefaultRouter

from console.control.api.views import DeploymentViewSet

# Paths work with and without the trailing slash: clients write both.
router = DefaultRouter()
router.trailing_slash = "/?"
router.register("deployments", DeploymentViewSet, basename="deployment")
urlpatterns = router.urls
