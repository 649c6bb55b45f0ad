from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    name = "console.diagnosis"
    label = "diagnosis"
