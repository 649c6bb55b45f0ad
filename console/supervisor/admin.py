from django.contrib import admin

from console.supervisor.models import ManagedProcess


@admin.register(ManagedProcess)
class ManagedProcessAdmin(admin.ModelAdmin):
    list_display = ["deployment", "slot", "state", "pid", "port", "restarts"]
    readonly_fields = [f.name for f in ManagedProcess._meta.fields]
