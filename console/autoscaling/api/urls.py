from console.api_router import ID, api_path
from console.autoscaling.api.views import (
    AutoscalingView,
    DecisionList,
    PolicyView,
    RatioBandFromAdviceView,
    RatioBandView,
)

urlpatterns = [
    api_path(rf"deployments/{ID}/autoscaling", AutoscalingView.as_view(),
             name="deployment-autoscaling"),
    api_path(rf"deployments/{ID}/autoscaling/ratio-band", RatioBandView.as_view(),
             name="deployment-ratio-band"),
    api_path(rf"deployments/{ID}/autoscaling/ratio-band/from-advice",
             RatioBandFromAdviceView.as_view(), name="deployment-ratio-band-from-advice"),
    # Any segment is a role to the view: one the plan lacks is a 400 naming "role", not a 404.
    api_path(rf"deployments/{ID}/autoscaling/(?P<role>[^/.]+)",
             PolicyView.as_view(), name="deployment-pool-policy"),
    api_path(rf"deployments/{ID}/scaling-decisions", DecisionList.as_view(),
             name="deployment-scaling-decisions"),
]
