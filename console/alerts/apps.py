from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_save, pre_save


def _ready_made_rules(sender: Any, instance: Any, created: bool, raw: bool = False,
                      **kwargs: Any) -> None:
    if created and not raw:
        from console.alerts.models import AlertRule
        from console.alerts.ready_made import ensure_rules

        ensure_rules(instance, AlertRule)


def _thresholds_follow_the_plan(sender: Any, instance: Any, raw: bool = False,
                                **kwargs: Any) -> None:
    if raw or instance.pk is None:
        return
    from console.alerts.models import AlertRule
    from console.alerts.ready_made import follow_plan

    before = sender.objects.filter(pk=instance.pk).first()
    if before is not None:
        follow_plan(before, instance, AlertRule)


class AlertsConfig(AppConfig):
    name = "console.alerts"
    label = "alerts"

    def ready(self) -> None:
        from console.alerts.prometheus_rules import exported_families
        from console.alerts.streams import EventSource
        from console.deployments.models import Deployment
        from console.live.hub import register_source
        from console.live.metrics_export import register_provider

        # Every deployment gets the ready-made rules when it is created.
        post_save.connect(_ready_made_rules, sender=Deployment,
                          dispatch_uid="alerts-ready-made-rules")
        pre_save.connect(_thresholds_follow_the_plan, sender=Deployment,
                         dispatch_uid="alerts-thresholds-follow-the-plan")
        register_source(EventSource)
        # The gauges that the Prometheus rule file reads, on the console's /metrics.
        register_provider(exported_families)
