from console.api_router import ID, api_path, api_router
from console.verification.api.views import DeploymentVerificationsView, VerificationViewSet

router = api_router()
router.register("verifications", VerificationViewSet, basename="verification")
urlpatterns = [
    api_path(rf"deployments/{ID}/verifications", DeploymentVerificationsView.as_view(),
             name="deployment-verifications"),
    *router.urls,
]
