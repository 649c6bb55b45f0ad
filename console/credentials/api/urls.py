from console.api_router import api_path, api_router
from console.credentials.api.views import ApiTokenViewSet, LoginView

router = api_router()
router.register("tokens", ApiTokenViewSet, basename="apitoken")
urlpatterns = [
    api_path("auth/token", LoginView.as_view(), name="api-token"),
    *router.urls,
]
