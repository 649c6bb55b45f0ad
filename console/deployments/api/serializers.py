from __future__ import annotations

from rest_framework import serializers

from console.deployments.models import Deployment, WorkerPlan
from console.deployments.status import overall_state
from console.supervisor.models import ManagedProcess


class ProcessSerializer(serializers.ModelSerializer):
    class Meta:
        model = ManagedProcess
        fields = ["id", "slot", "role", "port", "pid", "state", "restarts", "exit_code", "last_error",
                  "started_at", "ready_at"]


class WorkerPlanSerializer(serializers.ModelSerializer):
    variant = serializers.CharField(source="variant.name")
    model_path = serializers.CharField(source="variant.path")

    class Meta:
        model = WorkerPlan
        fields = ["slot", "role", "index", "variant", "model_path", "host", "port",
                  "side_channel_port", "cpu_cores", "gpu_indices"]


class DeploymentSerializer(serializers.ModelSerializer):
    base_model = serializers.CharField(source="base_model.name")
    state = serializers.SerializerMethodField()
    router_url = serializers.CharField()
    workers = WorkerPlanSerializer(many=True)
    processes = ProcessSerializer(many=True)

    class Meta:
        model = Deployment
        fields = ["id", "name", "base_model", "served_model_name", "mode", "max_model_len",
                  "kv_channel", "kv_cache_gib", "dtype", "sampling_defaults", "router_url",
                  "desired_state", "state", "workers", "processes", "created", "updated"]

    def get_state(self, deployment: Deployment) -> str:
        return overall_state(deployment, list(deployment.processes.all()))
