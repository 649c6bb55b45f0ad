from django.apps import AppConfig


class LiveConfig(AppConfig):
    name = "console.live"
    label = "live"

    def ready(self) -> None:
        from console.live.access import connect_signals

        # Open websockets re-check their reader's access when it changes.
        connect_signals()
