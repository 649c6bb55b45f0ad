from console.alerts.api.views import (
    AlertEventViewSet,
    AlertRuleViewSet,
    AlertViewSet,
    DeliveryViewSet,
    DeploymentRuleFileView,
    NotifierViewSet,
    RuleFileView,
    SilenceViewSet,
)
from console.api_router import ID, api_path, api_router

router = api_router()
router.register("alert-rules", AlertRuleViewSet, basename="alertrule")
router.register("alerts", AlertViewSet, basename="alert")
router.register("alert-events", AlertEventViewSet, basename="alertevent")
router.register("silences", SilenceViewSet, basename="silence")
router.register("notifiers", NotifierViewSet, basename="notifier")
router.register("deliveries", DeliveryViewSet, basename="delivery")
urlpatterns = [
    api_path("alert-rules.yaml", RuleFileView.as_view(), name="alert-rule-file"),
    api_path(rf"deployments/{ID}/alert-rules.yaml", DeploymentRuleFileView.as_view(),
             name="deployment-alert-rule-file"),
    *router.urls,
]
