from console.api_router import api_router
from console.supervisor.api.views import ProcessViewSet

router = api_router()
router.register("processes", ProcessViewSet, basename="process")
urlpatterns = router.urls
