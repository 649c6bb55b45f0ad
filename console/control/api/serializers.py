"""A deployment as read: its plan composed with the state of its processes and its gate."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.control.status import degraded_role, overall_state
from console.deployments.api.serializers import WorkerPlanSerializer
from console.deployments.models import Deployment
from console.quality.api.serializers import GateStatusSerializer, gate_settings
from console.rollouts import revisions
from console.rollouts import services as rollout_services
from console.supervisor.api.serializers import ProcessSerializer


class DeploymentSerializer(serializers.ModelSerializer):
    """A deployment as read: the plan, its workers, and the state of its processes."""

    base_model = serializers.CharField(source="base_model.name")
    state = serializers.SerializerMethodField()
    degraded = serializers.SerializerMethodField()
    revision = serializers.SerializerMethodField()
    rollout = serializers.SerializerMethodField()
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
                  "sampling_defaults", "tool_call_parser", "enable_auto_tool_choice",
                  "chat_template", "reasoning_parser", "extra_engine_args", "verify_after_start",
                  "max_images_per_prompt", "max_image_bytes", "max_image_pixels", "media_paths",
                  "media_domains",
                  "router", "gate",
                  "router_url", "desired_state", "state", "degraded", "revision", "rollout",
                  "workers", "processes", "created", "updated"]

    def get_state(self, deployment: Deployment) -> str:
        return overall_state(deployment, list(deployment.processes.all()))

    @extend_schema_field({"type": "string", "nullable": True, "enum": ["prefill", "decode", None],
                          "description": "in state degraded: the role with no ready worker, "
                                         "which the router serves without"})
    def get_degraded(self, deployment: Deployment) -> str | None:
        if deployment.desired_state != Deployment.DesiredState.RUNNING:
            return None
        return degraded_role(list(deployment.processes.all())) or None

    @extend_schema_field(GateStatusSerializer)
    def get_gate(self, deployment: Deployment) -> dict[str, Any]:
        return gate_settings(deployment)

    @extend_schema_field({"type": "object", "nullable": True, "description":
                          "the live revision: its number and when it was made"})
    def get_revision(self, deployment: Deployment) -> dict[str, Any] | None:
        prefetched = getattr(deployment, "live_revisions", None)
        live = prefetched[0] if prefetched else (
            None if prefetched is not None else revisions.live(deployment))
        return None if live is None else {"number": live.number, "created": live.created}

    @extend_schema_field({"type": "object", "nullable": True, "description":
                          "the rollout in progress: its id, state, revisions and weights"})
    def get_rollout(self, deployment: Deployment) -> dict[str, Any] | None:
        prefetched = getattr(deployment, "active_rollouts", None)
        rollout = prefetched[0] if prefetched else (
            None if prefetched is not None else rollout_services.active(deployment))
        if rollout is None:
            return None
        return {"id": rollout.pk, "state": rollout.state, "strategy": rollout.strategy,
                "from_revision": rollout.from_revision.number,
                "to_revision": rollout.to_revision.number, "weights": rollout.weights}

    def get_router(self, deployment: Deployment) -> dict[str, Any]:
        return {"host": deployment.router_host, "port": deployment.router_port,
                "prefill_policy": deployment.prefill_policy,
                "decode_policy": deployment.decode_policy,
                "pd_policy": deployment.pd_policy,
                "stall_budget_ms": deployment.stall_budget_ms,
                "degraded_mode": deployment.degraded_mode}
