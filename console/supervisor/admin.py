import json

from django.contrib import admin

from console.supervisor.models import ManagedProcess

# Environment variables whose names contain one of these hold secrets: the admin shows only
# that they are set.
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MASK = "********"


def masked(env: dict[str, str]) -> dict[str, str]:
    return {name: MASK if any(part in name.upper() for part in SECRET_NAME_PARTS) else value
            for name, value in env.items()}


@admin.register(ManagedProcess)
class ManagedProcessAdmin(admin.ModelAdmin):
    list_display = ["deployment", "slot", "state", "pid", "port", "restarts"]
    exclude = ["env"]
    readonly_fields = [*(f.name for f in ManagedProcess._meta.fields if f.name != "env"),
                       "environment"]

    @admin.display(description="env (secrets masked)")
    def environment(self, process: ManagedProcess) -> str:
        return json.dumps(masked(process.env), indent=1, sort_keys=True)
