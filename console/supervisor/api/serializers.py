from __future__ import annotations

from rest_framework import serializers

from console.supervisor.models import ManagedProcess


class ProcessSerializer(serializers.ModelSerializer):
    class Meta:
        model = ManagedProcess
        fields = ["id", "slot", "role", "port", "pid", "state", "degraded", "restarts", "exit_code",
                  "last_error", "started_at", "ready_at"]


class ProcessRowSerializer(ProcessSerializer):
    """A row of the process table on its own: its deployment (none for a requested process),
    its kind and what is wanted of it."""

    class Meta(ProcessSerializer.Meta):
        fields = ["id", "deployment", "kind", *ProcessSerializer.Meta.fields[1:], "wanted"]
