from django.apps import AppConfig


class QualityConfig(AppConfig):
    name = "console.quality"
    label = "quality"
