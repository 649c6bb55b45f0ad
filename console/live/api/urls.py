from console.api_router import ID, api_path
from console.live.api import views

urlpatterns = [
    api_path(rf"processes/{ID}/logs", views.process_logs, name="process-logs"),
    api_path(rf"processes/{ID}/logs/download", views.process_logs_download,
             name="process-logs-download"),
    api_path(rf"deployments/{ID}/metrics", views.deployment_metrics,
             name="deployment-metrics"),
]
