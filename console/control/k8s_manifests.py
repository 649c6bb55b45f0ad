"""A deployment's plan as Kubernetes objects, for ``manage.py export-k8s``.

The supervisor's launch specs are the source (console/control/worker_specs.py): a role's
containers run the argv and environment the supervisor runs for the role's first instance, and
the router's container the supervisor's router command. Only what belongs to one host is
replaced by a pod's own:

- addresses: a worker binds and advertises its pod's IP, ``$(POD_IP)``, which the kubelet
  expands from the downward API (vLLM's --host, VLLM_HOST_IP, NIXL's side-channel host); the
  router listens on every address of its pod, and reaches each role through the role's Service;
- ports: every pod of a role listens on the role's first instance's ports: each pod has an
  address of its own, so the ports the plan gives its other instances (one host's) are unused;
- files: model directories on the ``pdserve-models`` claim under /models/<base>/<variant>, the
  shared-storage KV directory on the ``<name>-kv`` claim (prefill and decode pods share it), the
  compile cache in an emptyDir, the plan's chat template from a ConfigMap, and the router's key
  set from the ``<name>-router`` Secret;
- secrets: the router's admin token and the workers' key come from that Secret too (workers
  refuse callers without the key on every path but /health, inference/worker_auth.py);
- devices: a GPU pod sees its own GPUs numbered from 0 (the device plugin's), and a CPU pod the
  cores the kubelet gives it: no core list of the plan's, the model's threads held to those
  cores by the container's cpuset;
- NIXL's UCX transport: no ``UCX_NET_DEVICES``, so UCX picks among the pod's devices, since
  the interface that holds the pod's address is known only in the pod.

The objects: per role a Deployment (replicas: the plan's instances) and a Service; the router's
Deployment and Service; a ConfigMap with the plan's chat template, when it has one; a
PrometheusRule with the deployment's alert rules (console/alerts/prometheus_rules.py). The
gateway in front of every deployment's router is exported on its own (console/control/
k8s_gateway.py).

An instance's GPUs are one tensor-parallel group, under the supervisor as in a pod
(inference.launch.parallel_args: ``--tensor-parallel-size`` is the count of the instance's GPUs).
An instance that needs more GPUs than one Kubernetes node has (``gpus_per_node``; by default the
plan's own nodes, on which every instance fits, as the device checks hold) spans several pods:
its role becomes a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) whose groups are
``GPUs / gpus_per_node`` pods, laid out as vLLM lays out a model larger than a node: tensor
parallel within a pod, pipeline parallel over the group's pods, on a Ray cluster the group forms.
The same function writes those flags, from the pod's GPUs and the group's size.

No headless Service: decode reaches a prefill pod's NIXL side channel at the address prefill
hands over with the KV (its pod IP), not by name. The router is given one URL per role, the
role's Service, since a Deployment's pods have no names known when the router starts: Kubernetes
spreads the router's connections over a role's ready pods.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from console.alerts.models import AlertRule
from console.alerts.prometheus_rules import render_rule_file
from console.checks.memory import CPU_RUNTIME_BYTES, estimate
from console.checks.suite import enforce_handshake_compat
from console.control.k8s_objects import (
    CACHE_DIR,
    KEYS_FILE,
    KV_DIR,
    MODELS_CLAIM,
    MODELS_DIR,
    POD_IP,
    POD_PYTHON,
    RAY_PORT,
    ROLES,
    ROUTER_SECRET_DIR,
    SECRET_KEYS,
    SHM_LIMIT,
    TEMPLATE_DIR,
    TEMPLATE_FILE,
    WORKER_SECRET_KEY,
    ExportError,
    RoleLayout,
    Target,
    environment,
    http_probe,
    k8s_object,
    object_labels,
    object_name,
    pod_model_path,
    quantity,
    service,
    template_path,
)
from console.control.worker_specs import has_remote_peers, router_spec, worker_spec
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.services import keys_file_path
from inference.launch import build_command
from inference.worker_auth import WORKER_KEY_ENV


def layouts(deployment: Deployment, target: Target) -> list[RoleLayout]:
    workers = list(deployment.workers.select_related("variant__base", "node")
                   .prefetch_related("node__gpus").order_by("role", "index"))
    if not workers:
        raise ExportError(f"DEPLOYMENT: {deployment.name} plans no worker")
    by_role: dict[str, list[WorkerPlan]] = {}
    for worker in workers:
        by_role.setdefault(worker.role, []).append(worker)
    return [_layout(deployment, role, by_role[role], target) for role in ROLES if role in by_role]


def _layout(deployment: Deployment, role: str, instances: list[WorkerPlan],
            target: Target) -> RoleLayout:
    on_gpus = {bool(w.gpu_tuple()) for w in instances}
    if len(on_gpus) > 1:
        raise ExportError(f"DEPLOYMENT: the {role} pool has GPU and CPU instances, which one pod "
                          "template cannot run both; give them all GPUs or none")
    gpus = max(len(w.gpu_tuple()) for w in instances)
    if gpus:
        # The plan reserves no core for a GPU worker unless it pins some; its host memory is the
        # runtime alone, weights and KV cache being on the GPU (as memory.fit counts a node).
        cores = max(len(w.core_tuple()) for w in instances)
        memory = CPU_RUNTIME_BYTES
    else:
        # An unpinned CPU worker spreads over every core of its node (as device.conflict counts).
        cores = max(len(w.core_tuple()) or w.node.cpu_count for w in instances)
        memory = max(estimate(deployment, w).total for w in instances)
    group_size = 1
    if gpus and target.gpus_per_node and gpus > target.gpus_per_node:
        if gpus % target.gpus_per_node:
            raise ExportError(
                f"--gpus-per-node: a {role} instance uses {gpus} GPUs, which nodes of "
                f"{target.gpus_per_node} cannot split into equal pipeline stages; give a divisor "
                f"of {gpus}")
        group_size = gpus // target.gpus_per_node
    return RoleLayout(role, instances, gpus, cores, memory, group_size)


def manifests(deployment: Deployment, target: Target) -> list[dict[str, Any]]:
    """The deployment's objects, in the order they are best applied."""
    name = object_name(deployment)
    roles = layouts(deployment, target)
    objects: list[dict[str, Any]] = []
    if deployment.chat_template:
        objects.append(k8s_object("v1", "ConfigMap", name, "chat-template", "config", target,
                               data={TEMPLATE_FILE: deployment.chat_template}))
    handshake_compat = enforce_handshake_compat(deployment)
    for layout in roles:
        objects.append(_workload(deployment, layout, target, handshake_compat))
        objects.append(service(name, layout.role, layout.first.port, target,
                                leaders_only=layout.group_size > 1))
    objects.append(_router(deployment, roles, target))
    objects.append(service(name, "router", deployment.router_port, target))
    rules = _prometheus_rule(deployment, target)
    if rules is not None:
        objects.append(rules)
    return objects


def worker_process(deployment: Deployment, layout: RoleLayout,
                   handshake_compat: bool) -> tuple[list[str], dict[str, str]]:
    """The supervisor's command for the role's first instance, with a pod's addresses, files and
    devices in place of its host's (the module's docstring lists them)."""
    spec = replace(
        worker_spec(deployment, layout.first, handshake_compat, template_path(deployment),
                    remote_peers=has_remote_peers(layout.first, list(deployment.workers.all()))),
        host=POD_IP,
        model_path=pod_model_path(layout.first.variant),
        kv_storage_path=str(KV_DIR),
        cache_dir=str(CACHE_DIR),
        gpu_indices=tuple(range(layout.gpus_per_pod)),
        pipeline_parallel_size=layout.group_size,
        cpu_cores=(),
    )
    return build_command(spec, python=POD_PYTHON)


def _worker_resources(layout: RoleLayout) -> dict[str, Any]:
    # Requests equal to limits: the pod is Guaranteed, so a static CPU manager gives it whole
    # cores of its own, as the plan pins a worker's cores.
    limits: dict[str, str] = {"memory": quantity(layout.memory)}
    if layout.cores:
        limits["cpu"] = str(max(1, layout.cores // layout.group_size))
    if layout.gpus:
        limits["nvidia.com/gpu"] = str(layout.gpus_per_pod)
    return {"requests": dict(limits), "limits": limits}


def _worker_volumes(deployment: Deployment, name: str, layout: RoleLayout
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": MODELS_CLAIM, "readOnly": True}},
        {"name": "cache", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "models", "mountPath": str(MODELS_DIR), "readOnly": True},
        {"name": "cache", "mountPath": str(CACHE_DIR)},
    ]
    if deployment.kv_channel == "shared-storage" and layout.role != "colocated":
        volumes.append({"name": "kv", "persistentVolumeClaim": {"claimName": f"{name}-kv"}})
        mounts.append({"name": "kv", "mountPath": str(KV_DIR)})
    if deployment.chat_template:
        volumes.append({"name": "chat-template",
                        "configMap": {"name": f"{name}-chat-template"}})
        mounts.append({"name": "chat-template", "mountPath": str(TEMPLATE_DIR), "readOnly": True})
    if layout.gpus:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_LIMIT}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _worker_probes() -> dict[str, Any]:
    return {
        # A start compiles for minutes on a CPU and loads large weights for longer on GPUs:
        # liveness waits for the first healthy answer, for up to 30 minutes.
        "startupProbe": http_probe("http", 10, 180, 5),
        # vLLM's /health fails once its engine is dead: out of the Service at once, then
        # restarted after a minute.
        "readinessProbe": http_probe("http", 5, 2, 3),
        "livenessProbe": http_probe("http", 15, 4, 5),
    }


def _workload(deployment: Deployment, layout: RoleLayout, target: Target,
              handshake_compat: bool) -> dict[str, Any]:
    name = object_name(deployment)
    argv, env = worker_process(deployment, layout, handshake_compat)
    volumes, mounts = _worker_volumes(deployment, name, layout)
    ports = [{"name": "http", "containerPort": layout.first.port}]
    if deployment.kv_channel == "nixl" and layout.role != "colocated":
        ports.append({"name": "nixl-side", "containerPort": layout.first.side_channel_port})
    # The key the supervisor gives a worker in its environment; in a pod, from the Secret.
    key = {"name": WORKER_KEY_ENV, "valueFrom": {"secretKeyRef": {
        "name": f"{name}-router", "key": WORKER_SECRET_KEY}}}
    container: dict[str, Any] = {
        "name": "vllm", "image": target.image, "env": [*environment(env), key],
        "resources": _worker_resources(layout), "volumeMounts": mounts,
    }
    labels = object_labels(name, layout.role)
    if layout.group_size == 1:
        pod = {"containers": [{**container, "command": argv, "ports": ports, **_worker_probes()}],
               "volumes": volumes}
        return k8s_object("apps/v1", "Deployment", name, layout.role, layout.role, target,
                       spec={"replicas": len(layout.instances), "selector": {"matchLabels": labels},
                             "template": {"metadata": {"labels": labels}, "spec": pod}})
    # Sh starts the group's Ray node first; "$@" is the supervisor's argv, untouched by the shell.
    leader = {**container, "command": ["sh", "-c", f'ray start --head --port={RAY_PORT} '
                                       '--node-ip-address="$POD_IP" && exec "$@"', "vllm-leader"],
              "args": argv, "ports": [*ports, {"name": "ray", "containerPort": RAY_PORT}],
              **_worker_probes()}
    # LeaderWorkerSet gives every pod of a group its leader's address.
    follower = {**container, "command": [
        "sh", "-c", f'exec ray start --address="$LWS_LEADER_ADDRESS:{RAY_PORT}" '
                    '--node-ip-address="$POD_IP" --block']}
    return k8s_object("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", name, layout.role,
                   layout.role, target, spec={
                       "replicas": len(layout.instances),
                       "leaderWorkerTemplate": {
                           "size": layout.group_size,
                           # One lost pod breaks the instance's Ray cluster: the group restarts whole.
                           "restartPolicy": "RecreateGroupOnPodRestart",
                           "leaderTemplate": {"metadata": {"labels": labels},
                                              "spec": {"containers": [leader], "volumes": volumes}},
                           "workerTemplate": {"metadata": {"labels": labels},
                                              "spec": {"containers": [follower],
                                                       "volumes": volumes}},
                       }})


def _service_view(layout: RoleLayout, name: str, target: Target) -> WorkerPlan:
    """The role as the router sees it: one worker at the role's Service, with the model
    directory the router's tokenizer reads in its pod. Unsaved copies: nothing is written."""
    view = copy.copy(layout.first)
    view.host = f"{name}-{layout.role}.{target.namespace}.svc"
    variant = copy.copy(layout.first.variant)
    variant.path = pod_model_path(variant)
    view.variant = variant
    return view


def router_process(deployment: Deployment, roles: Sequence[RoleLayout],
                   target: Target) -> tuple[list[str], dict[str, str]]:
    """The supervisor's router command, listening on every address of its pod, given the roles'
    Services and the pod's file paths; its environment still holds the secrets."""
    name = object_name(deployment)
    listening = copy.copy(deployment)
    listening.router_host = "0.0.0.0"
    spec = router_spec(listening, [_service_view(layout, name, target) for layout in roles],
                       template_path(deployment), Path(ROUTER_SECRET_DIR / KEYS_FILE), POD_PYTHON)
    # Not exported: the console's Redis is no address of the cluster's. The worker key is
    # there, and becomes a reference to the Secret in _router.
    env = {k: v for k, v in spec.env.items() if k != "REDIS_URL"}
    return spec.argv, env


def _router(deployment: Deployment, roles: Sequence[RoleLayout], target: Target) -> dict[str, Any]:
    name = object_name(deployment)
    argv, env = router_process(deployment, roles, target)
    secret = f"{name}-router"
    environment = [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret,
                                                                 "key": SECRET_KEYS[key]}}}
                   if key in SECRET_KEYS else {"name": key, "value": value}
                   for key, value in env.items()]
    volumes: list[dict[str, Any]] = [
        {"name": "models", "persistentVolumeClaim": {"claimName": MODELS_CLAIM, "readOnly": True}},
        {"name": "keys", "secret": {"secretName": secret,
                                    "items": [{"key": KEYS_FILE, "path": KEYS_FILE}]}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "models", "mountPath": str(MODELS_DIR), "readOnly": True},
        {"name": "keys", "mountPath": str(ROUTER_SECRET_DIR), "readOnly": True},
    ]
    if deployment.chat_template:
        volumes.append({"name": "chat-template", "configMap": {"name": f"{name}-chat-template"}})
        mounts.append({"name": "chat-template", "mountPath": str(TEMPLATE_DIR), "readOnly": True})
    container = {
        "name": "router", "image": target.image, "command": argv, "env": environment,
        "ports": [{"name": "http", "containerPort": deployment.router_port}],
        "volumeMounts": mounts,
        # /health answers 503 while no worker of a role is ready: out of the Service then, but
        # alive, since restarting the router would not bring a worker back.
        "readinessProbe": http_probe("http", 5, 2, 3),
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 15,
                          "failureThreshold": 4, "timeoutSeconds": 5},
    }
    labels = object_labels(name, "router")
    # One replica: the router keeps its pools' state, and without REDIS_URL the keys' rate
    # limits, in its own memory. The plan reserves no devices for it, so it requests none.
    return k8s_object("apps/v1", "Deployment", name, "router", "router", target, spec={
        "replicas": 1, "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [container], "volumes": volumes}}})


def _prometheus_rule(deployment: Deployment, target: Target) -> dict[str, Any] | None:
    rules = AlertRule.objects.filter(deployment=deployment).select_related("deployment")
    groups = yaml.safe_load(render_rule_file(rules))["groups"]
    if not groups:
        return None
    name = object_name(deployment)
    return k8s_object("monitoring.coreos.com/v1", "PrometheusRule", name, "alerts", "alerts",
                   target, spec={"groups": groups})


def needs(deployment: Deployment) -> list[str]:
    """What the objects refer to and the export does not write: the user provides it."""
    name = object_name(deployment)
    wanted = [f"PersistentVolumeClaim {MODELS_CLAIM}: each variant's directory at "
              "<base model>/<variant>, read by every worker and the router's tokenizer"]
    if deployment.kv_channel == "shared-storage" and deployment.mode == Deployment.Mode.PD:
        wanted.append(f"PersistentVolumeClaim {name}-kv (ReadWriteMany): the shared-storage KV "
                      "directory prefill writes and decode reads; nothing sweeps it in Kubernetes")
    keys = ["admin-token (the admin API's bearer token)",
            f"{WORKER_SECRET_KEY} (the key every worker wants and the router sends; any long "
            "random string)",
            f"{KEYS_FILE} (the key set the console writes to {keys_file_path(deployment)})"]
    if settings.PDSERVE_API_KEY:
        keys.append("api-key (the console's PDSERVE_API_KEY)")
    wanted.append(f"Secret {name}-router: {', '.join(keys)}")
    return wanted


class _Dumper(yaml.SafeDumper):
    """Writes a value shared by two objects (a role's labels, an LWS group's pod parts) out at
    each place, as people write manifests, instead of as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(deployment: Deployment, target: Target) -> str:
    """The objects as one multi-document YAML file, its header saying what it expects."""
    objects = manifests(deployment, target)
    header = [f"# pdserve deployment {deployment.name} for Kubernetes (manage.py export-k8s), "
              f"namespace {target.namespace}.", "# Provide before applying:"]
    header += [f"#   - {line}" for line in needs(deployment)]
    header.append("# Host-specific parts of the supervisor's commands (addresses, ports, paths, "
                  "devices) are the pods' own; see console/control/k8s_manifests.py.")
    return "\n".join(header) + "\n" + dump(objects)


def dump(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, explicit_start=True,
                         width=1_000_000)
