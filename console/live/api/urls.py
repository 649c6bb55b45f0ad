from django.urls import re_path

from console.live.api import views

urlpatterns = [
    # With or without the trailing slash: clients write both.
    re_path(r"^processes/(?P<process_id>[0-9]+)/logs/?$", views.process_logs, name="process-logs"),
    re_path(r"^processes/(?P<process_id>[0-9]+)/logs/download/?$", views.process_logs_download,
            name="process-logs-download"),
    re_path(r"^deployments/(?P<deployment_id>[0-9]+)/metrics/?$", views.deployment_metrics,
            name="deployment-metrics"),
]
