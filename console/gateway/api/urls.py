from rest_framework.routers import DefaultRouter

from console.gateway.api.views import ApiKeyViewSet

router = DefaultRouter()
router.trailing_slash = "/?"
router.include_root_view = False
router.register("keys", ApiKeyViewSet, basename="apikey")
urlpatterns = router.urls
