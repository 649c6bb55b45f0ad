from console.api_router import api_router
from console.quantization.api.views import QuantizationJobViewSet

router = api_router()
router.register("quantization-jobs", QuantizationJobViewSet, basename="quantizationjob")
urlpatterns = router.urls
