
import django.db.models.deletion

import console.accounts.roles
from django.db import migrations, models


def to_default_team(apps, schema_editor):
    """What existed before teams belongs to the default team, which make up's admin runs."""
    rows = apps.get_model("deployments", "Deployment").objects.filter(team__isnull=True)
    if not rows.exists():
        return
    team, _ = apps.get_model("accounts", "Team").objects.get_or_create(
        name="default", defaults={"description": "the team make up creates"})
    rows.update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('deployments', '0005_kv_load_failure'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='team',
            field=models.ForeignKey(help_text='the team that owns the deployment, its keys and rollouts', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='deployments', to='accounts.team'),
        ),
        migrations.RunPython(to_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='deployment',
            name='team',
            field=models.ForeignKey(default=console.accounts.roles.default_team_id, help_text='the team that owns the deployment, its keys and rollouts', on_delete=django.db.models.deletion.PROTECT, related_name='deployments', to='accounts.team'),
        ),
    ]
