from django.urls import path

from console.deployments import views

urlpatterns = [
    path("", views.deployment_list, name="deployment-list"),
    path("deployments/<slug:name>/", views.deployment_detail, name="deployment-detail"),
    path("deployments/<slug:name>/processes/", views.deployment_processes,
         name="deployment-processes"),
    path("deployments/<slug:name>/start/", views.deployment_start, name="deployment-start"),
    path("deployments/<slug:name>/stop/", views.deployment_stop, name="deployment-stop"),
]
