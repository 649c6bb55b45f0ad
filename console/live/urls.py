from django.urls import re_path

from console.live import views

urlpatterns = [
    # Prometheus asks for /metrics; people type /metrics/ too.
    re_path(r"^metrics/?$", views.prometheus_metrics, name="prometheus-metrics"),
]
