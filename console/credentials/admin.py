from django.contrib import admin

from console.credentials.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "user", "created_at", "expires_at", "last_used_at",
                    "revoked_at"]
    list_select_related = ["user"]
    # Made and revoked through the console, which audits both; never edited here.
    readonly_fields = ["user", "name", "prefix", "secret_hash", "created_at", "expires_at",
                       "revoked_at", "last_used_at"]

    def has_add_permission(self, request: object) -> bool:
        return False
