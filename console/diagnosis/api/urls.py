from console.api_router import ID, api_path
from console.diagnosis.api import views

urlpatterns = [
    api_path(rf"deployments/{ID}/doctor", views.deployment_doctor, name="deployment-doctor-api"),
]
