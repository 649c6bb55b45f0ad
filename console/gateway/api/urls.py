from console.api_router import api_path, api_router
from console.gateway.api.views import (
    ApiKeyViewSet,
    ModelAliasViewSet,
    UsageExportView,
    UsageViewSet,
)

router = api_router()
router.register("keys", ApiKeyViewSet, basename="apikey")
router.register("aliases", ModelAliasViewSet, basename="modelalias")
router.register("usage", UsageViewSet, basename="usage")
urlpatterns = [
    api_path("usage/export.csv", UsageExportView.as_view(), name="usage-export"),
    *router.urls,
]
