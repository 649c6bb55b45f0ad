from django.urls import path
from rest_framework.routers import DefaultRouter

from console.quality.api.views import DeploymentGateView, GateResultViewSet, MeasurementViewSet

router = DefaultRouter()
router.trailing_slash = "/?"
router.include_root_view = False
router.register("gate-results", GateResultViewSet, basename="gateresult")
router.register("measurements", MeasurementViewSet, basename="measurement")
urlpatterns = [
    path("deployments/<int:pk>/gate", DeploymentGateView.as_view(), name="deployment-gate"),
    path("deployments/<int:pk>/gate/", DeploymentGateView.as_view()),
    *router.urls,
]
