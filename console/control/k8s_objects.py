"""The parts of ``manage.py export-k8s``'s objects that every kind shares: the names, paths
and labels, the target, a role's pod layout, and the small builders (an object's frame, a
Service, a probe, an environment, a quantity). console/control/k8s_manifests.py says which
host-specific parts of the supervisor's commands become a pod's own, and builds the objects."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from console.catalog.models import Variant
from console.deployments.models import Deployment, WorkerPlan

DEFAULT_IMAGE = "pdserve:latest"
# The image's interpreter, instead of the console's virtual environment.
POD_PYTHON = "python3"
POD_IP = "$(POD_IP)"
MODELS_CLAIM = "pdserve-models"
MODELS_DIR = PurePosixPath("/models")
KV_DIR = PurePosixPath("/var/lib/pdserve/kv")
CACHE_DIR = PurePosixPath("/var/cache/pdserve")
TEMPLATE_DIR = PurePosixPath("/etc/pdserve/chat-template")
TEMPLATE_FILE = "template.jinja"
ROUTER_SECRET_DIR = PurePosixPath("/etc/pdserve/router")
KEYS_FILE = "keys.json"
# The router's environment variables that carry secrets, and their keys in its Secret. The
# workers read the worker key from the same Secret (WORKER_SECRET_KEY), so router and workers
# agree on it without the export writing it out.
WORKER_SECRET_KEY = "worker-key"
SECRET_KEYS = {"PDSERVE_ROUTER_ADMIN_TOKEN": "admin-token", "PDSERVE_API_KEY": "api-key",
               "PDSERVE_WORKER_KEY": WORKER_SECRET_KEY}
RAY_PORT = 6379
# A Ray GPU cluster talks through shared memory (NCCL); a container's own /dev/shm is 64 MiB.
SHM_LIMIT = "1Gi"
ROLES = ("prefill", "decode", "colocated")
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Kubernetes names: a DNS label (a Service's must begin with a letter), and the longest suffix
# this module puts after a deployment's name.
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LONGEST_SUFFIX = len("-chat-template")


class ExportError(ValueError):
    """A plan that cannot be written as asked; the message names the argument to change."""


@dataclass(frozen=True)
class Target:
    namespace: str
    image: str = DEFAULT_IMAGE
    gpus_per_node: int | None = None  # None: each instance fits one node, as in the plan


@dataclass(frozen=True)
class RoleLayout:
    """One role's pods: the instances' largest devices, since they share one pod template."""

    role: str
    instances: list[WorkerPlan]
    gpus: int  # per instance
    cores: int  # per instance; 0: none reserved
    memory: int  # host memory per pod, in bytes
    group_size: int  # pods per instance: more than one spans nodes (a LeaderWorkerSet)

    @property
    def first(self) -> WorkerPlan:
        return self.instances[0]

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus // self.group_size


def object_name(deployment: Deployment) -> str:
    """The prefix of the deployment's Kubernetes names: its name as a DNS label."""
    name = deployment.name.lower().replace("_", "-")
    if not NAME.fullmatch(name) or len(name) + LONGEST_SUFFIX > 63:
        raise ExportError(f"DEPLOYMENT: {deployment.name!r} makes no Kubernetes name: one needs a "
                          f"letter first and at most {63 - LONGEST_SUFFIX} characters")
    return name


def pod_model_path(variant: Variant) -> str:
    return str(MODELS_DIR / variant.base.name / variant.name)


def object_labels(name: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "pdserve", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component}


def k8s_object(api_version: str, kind: str, name: str, suffix: str, component: str, target: Target,
            **body: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": f"{name}-{suffix}", "namespace": target.namespace,
                         "labels": object_labels(name, component)}, **body}


def template_path(deployment: Deployment) -> Path | None:
    return Path(TEMPLATE_DIR / TEMPLATE_FILE) if deployment.chat_template else None


def quantity(size: int) -> str:
    return f"{math.ceil(size / 2**20)}Mi"


def http_probe(port: str, period_s: int, failures: int, timeout_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": port}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": timeout_s}


def environment(env: dict[str, str]) -> list[dict[str, Any]]:
    # POD_IP first: the kubelet expands $(POD_IP) only from variables defined before it.
    return [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *({"name": key, "value": value} for key, value in env.items())]


def service(name: str, component: str, port: int, target: Target,
             leaders_only: bool = False) -> dict[str, Any]:
    selector = object_labels(name, component)
    if leaders_only:
        # A group's leader serves HTTP; its other pods are Ray nodes.
        selector[LWS_INDEX_LABEL] = "0"
    return k8s_object("v1", "Service", name, component, component, target, spec={
        "selector": selector,
        "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]})
