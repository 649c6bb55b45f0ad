from django.apps import AppConfig


class VerificationConfig(AppConfig):
    name = "console.verification"
    label = "verification"
