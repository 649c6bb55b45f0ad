from console.api_router import api_path, api_router
from console.gateway.api.views import (
    ApiKeyViewSet,
    GatewayTrafficView,
    ModelAliasViewSet,
    TeamBudgetViewSet,
    UsageExportView,
    UsageViewSet,
)

router = api_router()
router.register("keys", ApiKeyViewSet, basename="apikey")
router.register("aliases", ModelAliasViewSet, basename="modelalias")
router.register("usage", UsageViewSet, basename="usage")
router.register("team-budgets", TeamBudgetViewSet, basename="teambudget")
urlpatterns = [
    api_path("usage/export.csv", UsageExportView.as_view(), name="usage-export"),
    api_path("gateway/traffic", GatewayTrafficView.as_view(), name="gateway-traffic"),
    *router.urls,
]
