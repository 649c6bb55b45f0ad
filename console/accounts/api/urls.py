from console.accounts.api.views import TeamViewSet, UserViewSet
from console.api_router import api_router

router = api_router()
router.register("teams", TeamViewSet, basename="team")
router.register("users", UserViewSet, basename="user")
urlpatterns = router.urls
