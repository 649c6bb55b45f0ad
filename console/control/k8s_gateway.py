"""The gateway as Kubernetes objects, for ``manage.py export-k8s --gateway``: one OpenAI
endpoint in front of every deployment's exported router, as the supervisor runs it.

- a Deployment of ``PDSERVE_GATEWAY_REPLICAS`` pods running the supervisor's gateway command
  (console/gateway/gateway_process.py), listening on every address of its pod on port 8090;
- a Service in front of them (port 8090): Kubernetes spreads clients over the ready replicas,
  as the load balancer in front of the supervisor's replicas does;
- its configuration as a Secret (``pdserve-gateway-config``: it holds the keys' hashes), the
  console's (console/gateway/routes_config.py) with each deployment's router at its exported
  Service, ``<name>-router``, and each deployment's in-flight limit from its plan (the plan's
  concurrency times its instances that generate), divided among the replicas as under the
  supervisor. The pods read it at start; its version is an annotation of the pod template, so
  applying a newer export (keys or aliases changed) rolls the replicas onto it.

The replicas share nothing but that file: what must be counted across them (keys' limits,
budgets, revision pinning, usage) is counted by the routers behind them. The admin token comes
from the Secret ``pdserve-gateway`` the user provides, never from the file; nothing pushes a
configuration to the pods, so its admin API only answers reads.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings

from console.control.k8s_manifests import dump
from console.control.k8s_objects import (
    POD_PYTHON,
    ExportError,
    Target,
    http_probe,
    k8s_object,
    object_labels,
    object_name,
    service,
)
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.routes_config import gateway_config, max_in_flight, replica_share, versioned

NAME = "pdserve"  # the objects are pdserve-gateway and pdserve-gateway-config
GATEWAY_PORT = 8090
CONFIG_DIR = PurePosixPath("/etc/pdserve/gateway")
CONFIG_FILE = "config.json"
ADMIN_SECRET = f"{NAME}-gateway"
ADMIN_SECRET_KEY = "admin-token"
CONFIG_VERSION_ANNOTATION = "pdserve.io/gateway-config-version"


def cluster_config(target: Target) -> dict[str, Any]:
    """The console's gateway configuration with the cluster's addresses and the plans' limits."""
    config = gateway_config()
    replicas = settings.PDSERVE_GATEWAY_REPLICAS
    plans = {d.name: d for d in Deployment.objects.prefetch_related("workers")}
    entries = []
    for entry in config["deployments"]:
        deployment = plans[entry["name"]]
        try:
            name = object_name(deployment)
        except ExportError:
            # Its plan cannot be exported either: nothing on the cluster to route to.
            entries.append({**entry, "router": None,
                            "state": "not on the cluster (its name is no Kubernetes name)"})
            continue
        # Every exported instance counts: Kubernetes keeps them running, and a pod that is not
        # ready is out of its role's Service.
        serving = sum(w.role in ("decode", "colocated") for w in deployment.workers.all())
        entries.append({**entry, "state": "running",
                        "router": f"http://{name}-router.{target.namespace}.svc:"
                                  f"{deployment.router_port}",
                        "max_concurrency": replica_share(max_in_flight(deployment, serving),
                                                         replicas)})
    return versioned({**config, "deployments": entries})


def manifests(target: Target) -> list[dict[str, Any]]:
    config = cluster_config(target)
    secret = k8s_object("v1", "Secret", NAME, "gateway-config", "gateway", target,
                        type="Opaque",
                        stringData={CONFIG_FILE: json.dumps(config, sort_keys=True, indent=1)})
    return [secret, _workload(config["version"], target),
            service(NAME, "gateway", GATEWAY_PORT, target)]


def gateway_command() -> list[str]:
    """The supervisor's gateway command with the pod's interpreter, address, port and file."""
    return gateway_process.gateway_argv(POD_PYTHON, "0.0.0.0", GATEWAY_PORT,
                                        str(CONFIG_DIR / CONFIG_FILE))


def _workload(version: str, target: Target) -> dict[str, Any]:
    labels = object_labels(NAME, "gateway")
    container = {
        "name": "gateway", "image": target.image, "command": gateway_command(),
        "env": [{"name": gateway_process.ADMIN_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": ADMIN_SECRET, "key": ADMIN_SECRET_KEY}}}],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT}],
        "volumeMounts": [{"name": "config", "mountPath": str(CONFIG_DIR), "readOnly": True}],
        "readinessProbe": http_probe("http", 5, 2, 3),
        "livenessProbe": http_probe("http", 15, 4, 5),
    }
    return k8s_object("apps/v1", "Deployment", NAME, "gateway", "gateway", target, spec={
        "replicas": settings.PDSERVE_GATEWAY_REPLICAS, "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels,
                         "annotations": {CONFIG_VERSION_ANNOTATION: version}},
            "spec": {"containers": [container], "volumes": [
                {"name": "config", "secret": {"secretName": f"{NAME}-gateway-config"}}]}}})


def render(target: Target) -> str:
    """The objects as one multi-document YAML file, its header saying what it expects."""
    objects = manifests(target)
    header = [f"# pdserve's gateway for Kubernetes (manage.py export-k8s --gateway), namespace "
              f"{target.namespace}, {settings.PDSERVE_GATEWAY_REPLICAS} replica(s).",
              "# Provide before applying:"]
    header += [f"#   - {line}" for line in needs()]
    header.append("# Export again after changing keys or aliases: the pods read their "
                  "configuration at start; see console/control/k8s_gateway.py.")
    return "\n".join(header) + "\n" + dump(objects)


def needs() -> list[str]:
    return [f"Secret {ADMIN_SECRET}: {ADMIN_SECRET_KEY} (the gateway's admin API bearer token; "
            "any long random string)",
            "each deployment's router Service, <name>-router (manage.py export-k8s DEPLOYMENT); "
            "a deployment not exported answers 503 through the gateway (no router reached)"]
