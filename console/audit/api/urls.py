from console.api_router import api_router
from console.audit.api.views import AuditEntryViewSet

router = api_router()
router.register("audit", AuditEntryViewSet, basename="audit")
urlpatterns = router.urls
