from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.fleet.discovery import connector_name
from console.fleet.models import (
    GIB,
    MAX_CPU_FLAGS,
    MAX_GPU_MEMORY_BYTES,
    MAX_NODE_MEMORY_BYTES,
    Gpu,
    Node,
    NodeAgent,
    validate_cpu_flag,
)
from inference.kv_channels import CHANNEL_NAMES

# Each entry replaces the GPU list as a whole, a PATCH's too.
GPU_REQUIRED = ("index", "memory_gib")


def to_bytes(gib: float) -> int:
    """Rounded up, so that the GiB read back are never fewer than written: 0.1 GiB truncated
    read back as 0.0999..., under the minimum the API states."""
    return math.ceil(gib * GIB)


@extend_schema_field({"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]})
class IPAddressField(serializers.IPAddressField):
    """An IPv4 or IPv6 address, so stated in the schema (DRF's field states only a string)."""


class GpuSerializer(serializers.ModelSerializer):
    memory_gib = serializers.FloatField(min_value=0, max_value=MAX_GPU_MEMORY_BYTES / GIB)

    class Meta:
        model = Gpu
        fields = ["index", "name", "uuid", "memory_gib"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A PATCH of the node is partial down to its nested entries (DRF skips their required
        # fields then), but a GPU entry is always written whole.
        missing = {name: ["This field is required."] for name in GPU_REQUIRED if name not in attrs}
        if missing:
            raise serializers.ValidationError(missing)
        return attrs


class NodeAgentSerializer(serializers.ModelSerializer):
    """The node's agent as the judge of its heartbeats last saw it; null: no agent has run
    there (the console's own supervisor runs its workers)."""

    class Meta:
        model = NodeAgent
        fields = ["state", "state_since", "seen_at", "heartbeat"]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    """A node as read, and as written when added by hand (the local node is discovered)."""

    address = IPAddressField(help_text=Node._meta.get_field("address").help_text)
    cpu_count = serializers.IntegerField(min_value=1, max_value=4096)
    memory_gib = serializers.FloatField(min_value=0.1, max_value=MAX_NODE_MEMORY_BYTES / GIB)
    cpu_flags = serializers.ListField(
        child=serializers.CharField(validators=[validate_cpu_flag]), required=False,
        max_length=MAX_CPU_FLAGS, help_text=Node._meta.get_field("cpu_flags").help_text)
    kv_connectors = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(connector_name(c) for c in CHANNEL_NAMES)),
        required=False,
    )
    gpus = GpuSerializer(many=True, required=False)
    agent = NodeAgentSerializer(read_only=True, allow_null=True)

    class Meta:
        model = Node
        fields = ["id", "name", "address", "is_local", "cpu_count", "cpu_ids", "cpu_flags",
                  "memory_gib", "engine_package", "engine_version", "kv_connectors", "gpus",
                  "discovered_at", "agent"]
        read_only_fields = ["is_local", "cpu_ids", "discovered_at", "agent"]

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        indices = [gpu["index"] for gpu in gpus]
        if len(set(indices)) != len(indices):
            raise serializers.ValidationError("GPU indices must be distinct")
        return gpus

    def to_model_fields(self) -> dict[str, Any]:
        """The validated input in the model's units (core ids, bytes)."""
        data = dict(self.validated_data)
        if "cpu_count" in data:
            data["cpu_ids"] = list(range(data.pop("cpu_count")))
        if "memory_gib" in data:
            data["memory_bytes"] = to_bytes(data.pop("memory_gib"))
        if "cpu_flags" in data:
            data["cpu_flags"] = sorted(set(data["cpu_flags"]))
        if "gpus" in data:
            data["gpus"] = [
                {**{k: v for k, v in gpu.items() if k != "memory_gib"},
                 "memory_bytes": to_bytes(gpu["memory_gib"])}
                for gpu in data["gpus"]
            ]
        return data
