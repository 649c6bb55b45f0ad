"""Deployments made before alerting existed get the ready-made rules too."""

from django.db import migrations


def forwards(apps, schema_editor):
    from console.alerts.ready_made import ensure_rules

    rule_model = apps.get_model("alerts", "AlertRule")
    for deployment in apps.get_model("deployments", "Deployment").objects.all():
        ensure_rules(deployment, rule_model)


class Migration(migrations.Migration):
    dependencies = [("alerts", "0001_initial"), ("deployments", "0008_slos")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
