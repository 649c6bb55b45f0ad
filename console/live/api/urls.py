from console.api_router import api_path
from console.live.api import views

urlpatterns = [
    api_path(r"processes/(?P<process_id>[0-9]+)/logs", views.process_logs, name="process-logs"),
    api_path(r"processes/(?P<process_id>[0-9]+)/logs/download", views.process_logs_download,
             name="process-logs-download"),
    api_path(r"deployments/(?P<deployment_id>[0-9]+)/metrics", views.deployment_metrics,
             name="deployment-metrics"),
]
