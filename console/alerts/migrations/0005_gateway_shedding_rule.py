"""Deployments made before the gateway's queues existed get their ready-made rule ("Gateway
shedding")."""

from django.db import migrations


def forwards(apps, schema_editor):
    from console.alerts.ready_made import ensure_rules

    rule_model = apps.get_model("alerts", "AlertRule")
    for deployment in apps.get_model("deployments", "Deployment").objects.all():
        ensure_rules(deployment, rule_model)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0004_node_down_rule")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
