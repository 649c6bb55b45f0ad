from django.apps import AppConfig


class AdvisorConfig(AppConfig):
    name = "console.advisor"
    label = "advisor"
