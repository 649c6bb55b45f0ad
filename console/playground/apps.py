from django.apps import AppConfig


class PlaygroundConfig(AppConfig):
    name = "console.playground"
    label = "playground"
