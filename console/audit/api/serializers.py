from __future__ import annotations

from rest_framework import serializers

from console.audit.models import AuditEntry


class AuditEntrySerializer(serializers.ModelSerializer):
    """An entry as read (they are never written over the API)."""

    who = serializers.CharField(read_only=True, help_text="the actor as the page shows it")
    changes = serializers.DictField(
        child=serializers.ListField(min_length=2, max_length=2, allow_null=True),
        read_only=True, help_text="{field: [before, after]}, secrets masked")

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "user", "username", "who", "via", "address", "action",
                  "object_type", "object_id", "object_repr", "team_id", "changes"]
        read_only_fields = fields
