from django.urls import path, re_path

from console.live import views

urlpatterns = [
    # Prometheus asks for /metrics; people type /metrics/ too.
    re_path(r"^metrics/?$", views.prometheus_metrics, name="prometheus-metrics"),
    path("deployments/<slug:name>/dashboard/", views.deployment_dashboard, name="deployment-dashboard"),
    path("deployments/<slug:name>/requests/", views.request_timeline, name="request-timeline"),
    path("processes/<int:process_id>/log/", views.process_log, name="process-log"),
]
