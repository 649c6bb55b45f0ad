"""The audit log in Django's admin: read-only. Nothing there adds, changes or deletes an entry
(the model refuses it too)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from console.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["at", "who", "address", "action", "object_type", "object_repr"]
    list_filter = ["actor", "action"]
    search_fields = ["username", "action", "object_type", "object_id", "object_repr"]
    readonly_fields = [field.name for field in AuditEntry._meta.fields]
    # The bulk "delete selected" action would be offered otherwise.
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
