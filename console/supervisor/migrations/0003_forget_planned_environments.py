from django.db import migrations


def forget_planned_environments(apps, schema_editor):
    # Rows of workers and routers written before the supervisor stopped copying their
    # environment (bdced7f) may still hold the router's admin token; the plan rebuilds it anyway.
    apps.get_model("supervisor", "ManagedProcess").objects.filter(
        kind__in=["worker", "router"]).exclude(env={}).update(env={})


class Migration(migrations.Migration):

    dependencies = [
        ("supervisor", "0002_process_kinds"),
    ]

    operations = [
        migrations.RunPython(forget_planned_environments, migrations.RunPython.noop),
    ]
