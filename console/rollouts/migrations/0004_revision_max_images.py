from django.db import migrations

# Revisions made before plans had image limits hold none: they ran with the plan's default,
# one image a prompt (text models take none whatever the count).
DEFAULT_IMAGES = 1


def add_max_images(apps, schema_editor):
    Revision = apps.get_model("rollouts", "Revision")
    for revision in Revision.objects.all().only("pk", "spec"):
        if "max_images_per_prompt" not in revision.spec:
            Revision.objects.filter(pk=revision.pk).update(
                spec={**revision.spec, "max_images_per_prompt": DEFAULT_IMAGES})


class Migration(migrations.Migration):

    dependencies = [
        ("rollouts", "0003_verify_green"),
        ("deployments", "0011_plan_image_limits"),
    ]

    operations = [
        migrations.RunPython(add_max_images, migrations.RunPython.noop),
    ]
