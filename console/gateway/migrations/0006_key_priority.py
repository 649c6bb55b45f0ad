from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0005_key_budgets_and_model_limits'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='priority',
            field=models.CharField(choices=[('high', 'high'), ('normal', 'normal'), ('low', 'low')], default='normal', max_length=10),
        ),
        migrations.AddField(
            model_name='apikey',
            name='priority_header',
            field=models.BooleanField(default=False, help_text='requests may set X-Pdserve-Priority (up to the key\'s band) and X-Pdserve-Fairness-Id'),
        ),
    ]
