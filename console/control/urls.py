from django.urls import path

from console.control import views

urlpatterns = [
    path("", views.deployment_list, name="deployment-list"),
    path("deployments/new/", views.plan_new, name="plan-new"),
    path("deployments/new/check/", views.plan_check, name="plan-new-check"),
    path("deployments/new/propose/", views.plan_propose, name="plan-new-propose"),
    path("deployments/<slug:name>/", views.deployment_detail, name="deployment-detail"),
    path("deployments/<slug:name>/processes/", views.deployment_processes,
         name="deployment-processes"),
    path("deployments/<slug:name>/checks/", views.deployment_checks, name="deployment-checks"),
    path("deployments/<slug:name>/edit/", views.plan_edit, name="plan-edit"),
    path("deployments/<slug:name>/edit/check/", views.plan_check, name="plan-edit-check"),
    path("deployments/<slug:name>/edit/propose/", views.plan_propose, name="plan-edit-propose"),
    path("deployments/<slug:name>/start/", views.deployment_start, name="deployment-start"),
    path("deployments/<slug:name>/stop/", views.deployment_stop, name="deployment-stop"),
]
