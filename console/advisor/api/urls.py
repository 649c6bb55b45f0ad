from console.advisor.api.views import AdviceApplyView, AdviceMeasureView, AdviceView
from console.api_router import ID, api_path

urlpatterns = [
    api_path(rf"deployments/{ID}/advice", AdviceView.as_view(), name="deployment-topology-advice"),
    api_path(rf"deployments/{ID}/advice/apply", AdviceApplyView.as_view(),
             name="deployment-topology-advice-apply"),
    api_path(rf"deployments/{ID}/advice/measure", AdviceMeasureView.as_view(),
             name="deployment-topology-advice-measure"),
]
