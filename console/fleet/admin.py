from django.contrib import admin

from console.fleet.models import Gpu, Node


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "is_local", "engine_version", "discovered_at"]
    inlines = [GpuInline]
