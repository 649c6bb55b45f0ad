from __future__ import annotations

from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    name = "console.autoscaling"
    label = "autoscaling"

    def ready(self) -> None:
        from console.autoscaling.scaling_socket import ScalingSource
        from console.live.hub import register_source

        # Decisions and pool readings reach the autoscaling and deployment pages over the
        # deployment's socket.
        register_source(ScalingSource)
