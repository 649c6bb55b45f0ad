from django.apps import AppConfig


class SupervisorConfig(AppConfig):
    name = "console.supervisor"
    label = "supervisor"
