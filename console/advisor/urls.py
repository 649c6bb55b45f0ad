from django.urls import path

from console.advisor import views

urlpatterns = [
    path("deployments/<slug:name>/topology/", views.advice_page, name="topology-advice"),
    path("deployments/<slug:name>/topology/apply/", views.apply, name="topology-advice-apply"),
    path("deployments/<slug:name>/topology/measure/", views.measure, name="topology-advice-measure"),
    path("deployments/<slug:name>/topology/measurement/", views.measurement_panel,
         name="topology-measurement"),
]
