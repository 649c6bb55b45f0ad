from django.contrib import admin

from console.gateway.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "display_prefix", "all_deployments", "created_at", "last_used_at",
                    "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "created_by", "last_used_at"]
