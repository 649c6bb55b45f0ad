from django.contrib import admin

from console.deployments.models import Deployment, WorkerPlan


class WorkerPlanInline(admin.TabularInline):
    model = WorkerPlan
    extra = 0


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "served_model_name", "mode", "kv_channel", "desired_state"]
    inlines = [WorkerPlanInline]
