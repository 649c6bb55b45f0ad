from django.urls import path

from console.quality import views

urlpatterns = [
    path("deployments/<slug:name>/gate/", views.gate_panel, name="deployment-gate-panel"),
    path("deployments/<slug:name>/gate/run/", views.gate_run, name="deployment-gate-run"),
    path("deployments/<slug:name>/advice/", views.advice_panel, name="deployment-advice"),
    path("deployments/<slug:name>/advice/measure/", views.measure, name="deployment-measure"),
]
