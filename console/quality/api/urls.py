from console.api_router import ID, api_path, api_router
from console.quality.api.views import DeploymentGateView, GateResultViewSet, MeasurementViewSet

router = api_router()
router.register("gate-results", GateResultViewSet, basename="gateresult")
router.register("measurements", MeasurementViewSet, basename="measurement")
urlpatterns = [
    api_path(rf"deployments/{ID}/gate", DeploymentGateView.as_view(), name="deployment-gate"),
    *router.urls,
]
