"""A deployment as read: its plan composed with the state of its processes and its gate."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.control.status import overall_state
from console.deployments.api.serializers import WorkerPlanSerializer
from console.deployments.models import Deployment
from console.quality.api.serializers import GateStatusSerializer, gate_settings
from console.supervisor.api.serializers import ProcessSerializer


class DeploymentSerializer(serializers.ModelSerializer):
    """A deployment as read: the plan, its workers, and the state of its processes."""

    base_model = serializers.CharField(source="base_model.name")
    state = serializers.SerializerMethodField()
    router_url = serializers.CharField()
    router = serializers.SerializerMethodField()
    gate = serializers.SerializerMethodField()
    workers = WorkerPlanSerializer(many=True)
    processes = ProcessSerializer(many=True)

    class Meta:
        model = Deployment
        fields = ["id", "name", "base_model", "served_model_name", "mode", "max_model_len",
                  "longest_request", "concurrency", "kv_channel", "kv_cache_gib", "block_size",
                  "kv_cache_dtype", "kv_load_failure", "dtype", "engine_version",
                  "sampling_defaults", "router", "gate",
                  "router_url", "desired_state", "state", "workers", "processes", "created",
                  "updated"]

    def get_state(self, deployment: Deployment) -> str:
        return overall_state(deployment, list(deployment.processes.all()))

    @extend_schema_field(GateStatusSerializer)
    def get_gate(self, deployment: Deployment) -> dict[str, Any]:
        return gate_settings(deployment)

    def get_router(self, deployment: Deployment) -> dict[str, Any]:
        return {"host": deployment.router_host, "port": deployment.router_port,
                "prefill_policy": deployment.prefill_policy,
                "decode_policy": deployment.decode_policy,
                "pd_policy": deployment.pd_policy,
                "stall_budget_ms": deployment.stall_budget_ms}
