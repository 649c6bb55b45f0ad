from django.apps import AppConfig


class QuantizationConfig(AppConfig):
    """Building quantized variants: jobs started from the catalog, run by a Celery task whose
    builder process the supervisor owns."""

    name = "console.quantization"
    label = "quantization"
