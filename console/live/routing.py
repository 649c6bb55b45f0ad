from django.urls import path

from console.live.consumers import DeploymentLiveConsumer, ProcessLogConsumer

websocket_urlpatterns = [
    path("ws/processes/<int:process_id>/logs/", ProcessLogConsumer.as_asgi()),
    path("ws/deployments/<int:deployment_id>/live/", DeploymentLiveConsumer.as_asgi()),
]
