from __future__ import annotations

from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "console.rollouts"
    label = "rollouts"

    def ready(self) -> None:
        from console.live.hub import register_source
        from console.rollouts.rollout_socket import RolloutSource

        # Transitions and analysis windows reach the rollout page over the deployment's socket.
        register_source(RolloutSource)
