"""Deployments made before autoscaling existed get its ready-made rule ("Scale-up refused")."""

from django.db import migrations


def forwards(apps, schema_editor):
    from console.alerts.ready_made import ensure_rules

    rule_model = apps.get_model("alerts", "AlertRule")
    for deployment in apps.get_model("deployments", "Deployment").objects.all():
        ensure_rules(deployment, rule_model)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0002_ready_made_rules"), ("deployments", "0009_deployment_extra_engine_args")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
