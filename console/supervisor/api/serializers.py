from __future__ import annotations

from rest_framework import serializers

from console.supervisor.models import ManagedProcess


class ProcessSerializer(serializers.ModelSerializer):
    class Meta:
        model = ManagedProcess
        fields = ["id", "slot", "role", "port", "pid", "state", "restarts", "exit_code", "last_error",
                  "started_at", "ready_at"]
