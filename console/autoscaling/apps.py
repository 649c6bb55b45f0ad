from __future__ import annotations

from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    name = "console.autoscaling"
    label = "autoscaling"
