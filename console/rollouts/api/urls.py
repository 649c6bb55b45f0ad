from console.api_router import ID, api_path, api_router
from console.rollouts.api.views import DeploymentRollbackView, RevisionsView, RolloutViewSet

router = api_router()
router.register("rollouts", RolloutViewSet, basename="rollout")
urlpatterns = [
    api_path(rf"deployments/{ID}/revisions", RevisionsView.as_view(), name="deployment-revisions"),
    api_path(rf"deployments/{ID}/rollback", DeploymentRollbackView.as_view(),
             name="deployment-rollback"),
    *router.urls,
]
