from django.apps import AppConfig


class ControlConfig(AppConfig):
    """The composition root: the deployment lifecycle (checks, then the gate, then the wanted
    state), the pages and API that compose every app, and the supervise daemon's loops."""

    name = "console.control"
    label = "control"
