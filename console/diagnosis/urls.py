from django.urls import path

from console.diagnosis import views

urlpatterns = [
    path("deployments/<slug:name>/doctor/", views.doctor_page, name="deployment-doctor"),
]
