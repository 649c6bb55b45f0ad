from django.urls import path

from console.quantization import views

urlpatterns = [
    path("models/<int:pk>/quantize/", views.quantize, name="catalog-quantize"),
    path("models/jobs/<int:pk>/cancel/", views.job_cancel, name="catalog-job-cancel"),
]
