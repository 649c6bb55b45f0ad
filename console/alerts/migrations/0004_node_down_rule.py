"""Deployments made before node agents existed get their ready-made rule ("Node down")."""

from django.db import migrations


def forwards(apps, schema_editor):
    from console.alerts.ready_made import ensure_rules

    rule_model = apps.get_model("alerts", "AlertRule")
    for deployment in apps.get_model("deployments", "Deployment").objects.all():
        ensure_rules(deployment, rule_model)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0003_scale_refused_rule"), ("fleet", "0003_node_agent")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
