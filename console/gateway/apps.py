from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "console.gateway"
    label = "gateway"
    verbose_name = "API keys"

    def ready(self) -> None:
        from console.gateway.usage import usage_families
        from console.live.metrics_export import register_provider

        # The stored usage per team, key and model, on the console's /metrics.
        register_provider(usage_families)
