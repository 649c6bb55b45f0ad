from django.urls import path

from console.live import log_views

urlpatterns = [
    path("processes/<int:process_id>/log/", log_views.process_log, name="process-log"),
    path("deployments/<slug:name>/requests/", log_views.request_timeline, name="request-timeline"),
]
