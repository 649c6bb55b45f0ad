from django.apps import AppConfig


class CredentialsConfig(AppConfig):
    name = "console.credentials"
    label = "credentials"
    verbose_name = "API tokens and logins"
