"""``manage.py export-k8s``: every object it writes is valid for its kind (the Kubernetes API's
schemas through kubernetes-validate, the CRDs' schemas vendored in k8s_schemas/), its containers
run the supervisor's commands with only the host-specific parts replaced, the router finds the
workers through the roles' Services with its secrets kept out of the file, and bad input is
refused by name."""

from __future__ import annotations

import json
import math
from io import StringIO
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from console.alerts.models import AlertRule
from console.alerts.prometheus_rules import render_rule_file
from console.checks.memory import CPU_RUNTIME_BYTES, estimate
from console.control.worker_specs import ProcessSpec, process_specs
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import GIB, Gpu, Node
from console.gateway import gateway_process
from console.gateway.router_admin import admin_token
from console.gateway.services import create_key
from console.supervisor.worker_keys import deployment_worker_key
from inference.gateway.config import parse_config
from inference.launch import OMP_BINDING_ENV
from inference.router.config import build_parser
from tests.console.sockets import free_port
from tests.console.tiny_models import CHAT_TEMPLATE, make_plan

pytestmark = pytest.mark.django_db

KUBERNETES = "1.37.0"
SCHEMAS = Path(__file__).parent / "k8s_schemas"
CORE_KINDS = {("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
              ("v1", "Secret")}
CRD_FILES = {("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-v1.json",
             ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json"}
MODEL = "/models/tiny/bf16"  # the pod's path of the tiny model: <base>/<variant> on the claim
TEMPLATE = "/etc/pdserve/chat-template/template.jinja"
POD_IP = "$(POD_IP)"


# ---- validation ------------------------------------------------------------------------------


def closed(schema: Any) -> Any:
    """A CRD schema as the API server applies it with strict field validation: an object that
    lists its properties takes no others, unless it says it keeps unknown fields."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


CRD_SCHEMAS = {kind: closed(json.loads((SCHEMAS / name).read_text()))
               for kind, name in CRD_FILES.items()}


def validate(document: dict[str, Any]) -> None:
    kind = (document["apiVersion"], document["kind"])
    if kind in CRD_SCHEMAS:
        jsonschema.Draft202012Validator(CRD_SCHEMAS[kind]).validate(document)
    else:
        assert kind in CORE_KINDS, f"no schema checks {kind}"
        kubernetes_validate.validate(document, KUBERNETES, strict=True)


def export(deployment: Deployment, *args: str) -> tuple[str, list[dict[str, Any]]]:
    out = StringIO()
    call_command("export-k8s", deployment.name, *args, stdout=out)
    text = out.getvalue()
    documents = [d for d in yaml.safe_load_all(text) if d is not None]
    for document in documents:
        validate(document)
    return text, documents


def named(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return only


def environment(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


# ---- the supervisor's commands with a pod's values -------------------------------------------


def with_values(argv: list[str], values: dict[str, str]) -> list[str]:
    out = list(argv)
    for flag, value in values.items():
        assert out.count(flag) == 1, (flag, argv)
        out[out.index(flag) + 1] = value
    return out


def pod_worker_argv(spec: ProcessSpec) -> list[str]:
    """What the export is documented to change in a worker's argv: the interpreter, the address,
    the model and template files, and the shared-storage KV directory."""
    values = {"--host": POD_IP, "--model": MODEL}
    if "--chat-template" in spec.argv:
        values["--chat-template"] = TEMPLATE
    if "--kv-transfer-config" in spec.argv:
        config = json.loads(spec.argv[spec.argv.index("--kv-transfer-config") + 1])
        extra = config.get("kv_connector_extra_config", {})
        if "shared_storage_path" in extra:
            extra["shared_storage_path"] = "/var/lib/pdserve/kv"
        values["--kv-transfer-config"] = json.dumps(config, separators=(",", ":"))
    return with_values(["python3", *spec.argv[1:]], values)


def pod_worker_env(spec: ProcessSpec, gpus: int, name: str) -> dict[str, Any]:
    env: dict[str, Any] = dict(spec.env)
    env["VLLM_HOST_IP"] = POD_IP
    env.update(VLLM_CACHE_ROOT="/var/cache/pdserve/vllm",
               TORCHINDUCTOR_CACHE_DIR="/var/cache/pdserve/inductor",
               XDG_CACHE_HOME="/var/cache/pdserve")
    # The kubelet's cores, not the host's: no binding of pdserve's; the container's cpuset
    # holds the model's threads.
    for key in ("VLLM_CPU_OMP_THREADS_BIND", *OMP_BINDING_ENV):
        env.pop(key, None)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    if "VLLM_NIXL_SIDE_CHANNEL_HOST" in env:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = POD_IP
        env.pop("UCX_NET_DEVICES", None)  # the pod's devices: UCX's choice among them
    # The key the supervisor adds at the spawn, from the router's Secret in a pod.
    env["VLLM_API_KEY"] = {"secretKeyRef": {"name": f"{name}-router", "key": "worker-key"}}
    return env


def assert_runs_the_supervisors_worker(documents: list[dict[str, Any]], name: str, namespace: str,
                                       spec: ProcessSpec, gpus: int = 0) -> dict[str, Any]:
    workload = named(documents, "Deployment", f"{name}-{spec.role}")
    vllm = container(workload)
    assert vllm["command"] == pod_worker_argv(spec)
    env = vllm["env"]
    assert env[0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert environment(env[1:]) == pod_worker_env(spec, gpus, name)
    ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
    assert ports["http"] == spec.port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    service = named(documents, "Service", f"{name}-{spec.role}")
    assert service["metadata"]["namespace"] == namespace
    assert service["spec"]["ports"][0]["port"] == spec.port
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    return workload


# ---- plans -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> None:
    # process_specs, the supervisor's side of the comparison, writes the template and key files.
    settings.DATA_DIR = tmp_path / "data"
    settings.PDSERVE_KV_DIR = tmp_path / "kv"


def gpu_node(name: str, address: str, gpus: int) -> Node:
    node = Node.objects.create(name=name, address=address, cpu_ids=list(range(16)),
                               memory_bytes=128 * GIB, engine_package="vllm")
    for index in range(gpus):
        Gpu.objects.create(node=node, index=index, name="NVIDIA L4", memory_bytes=24 * GIB)
    return node


def two_node_gpu_plan(tmp_path: Path) -> Deployment:
    """Prefill on four GPUs of node a; decode on two GPUs each, one instance on each node."""
    deployment = make_plan(tmp_path, name="gpu-pd", kv_channel="nixl")
    a, b = gpu_node("gpu-a", "10.0.0.1", 8), gpu_node("gpu-b", "10.0.0.2", 2)
    deployment.workers.filter(role="prefill").update(node=a, host=a.address, cpu_cores="",
                                                     gpu_indices="0,1,2,3")
    deployment.workers.filter(role="decode").update(node=a, host=a.address, cpu_cores="",
                                                    gpu_indices="4,5")
    decode = deployment.workers.get(role="decode")
    WorkerPlan.objects.create(deployment=deployment, role="decode", index=1, variant=decode.variant,
                              node=b, host=b.address, port=free_port(),
                              side_channel_port=free_port(), gpu_indices="0,1")
    return deployment


# ---- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_channel", ["shared-storage", "nixl"])
def test_a_pd_plan_becomes_valid_objects_running_the_supervisors_commands(
        tmp_path: Path, kv_channel: str) -> None:
    deployment = make_plan(tmp_path, kv_channel=kv_channel, chat_template=CHAT_TEMPLATE)
    text, documents = export(deployment, "--namespace", "serving", "--image", "reg.example/pd:1")
    name = deployment.name
    assert {d["metadata"]["namespace"] for d in documents} == {"serving"}
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in documents)
    assert kinds == sorted([
        ("ConfigMap", f"{name}-chat-template"), ("Deployment", f"{name}-prefill"),
        ("Deployment", f"{name}-decode"), ("Deployment", f"{name}-router"),
        ("Service", f"{name}-prefill"), ("Service", f"{name}-decode"),
        ("Service", f"{name}-router"), ("PrometheusRule", f"{name}-alerts")])
    supervisor = {spec.slot: spec for spec in process_specs(deployment)}
    for role in ("prefill", "decode"):
        worker = deployment.workers.get(role=role)
        workload = assert_runs_the_supervisors_worker(documents, name, "serving",
                                                      supervisor[f"{role}-0"])
        assert workload["spec"]["replicas"] == 1
        vllm = container(workload)
        assert vllm["image"] == "reg.example/pd:1"
        # One pinned core; memory from the memory check's estimate of the worker.
        mebibytes = math.ceil(estimate(deployment, worker).total / 2**20)
        assert vllm["resources"]["limits"] == {"cpu": "1", "memory": f"{mebibytes}Mi"}
        assert vllm["resources"]["requests"] == vllm["resources"]["limits"]
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "pdserve-models"
        if kv_channel == "shared-storage":
            assert volumes["kv"]["persistentVolumeClaim"]["claimName"] == f"{name}-kv"
        else:
            assert "kv" not in volumes
            ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
            assert ports["nixl-side"] == worker.side_channel_port
    config_map = named(documents, "ConfigMap", f"{name}-chat-template")
    assert config_map["data"] == {"template.jinja": CHAT_TEMPLATE}

    router = container(named(documents, "Deployment", f"{name}-router"))
    urls = {role: f"http://{name}-{role}.serving.svc:{deployment.workers.get(role=role).port}"
            for role in ("prefill", "decode")}
    # The supervisor's router keeps its usage ledger on the console's disk; an exported one has
    # no volume for it and meters in memory.
    supervised = supervisor["router"].argv
    ledger = supervised.index("--usage-file")
    assert "--usage-file" not in router["command"]
    assert router["command"] == with_values(
        ["python3", *supervised[1:ledger], *supervised[ledger + 2:]], {
            "--host": "0.0.0.0", "--tokenizer": MODEL, "--chat-template": TEMPLATE,
            "--prefill": urls["prefill"], "--decode": urls["decode"],
            "--keys-file": "/etc/pdserve/router/keys.json"})
    parsed = build_parser().parse_args(router["command"][3:])
    assert (parsed.prefill_urls, parsed.decode_urls) == ([urls["prefill"]], [urls["decode"]])
    # Each URL is a Service of the export, on the worker's port.
    for role, url in urls.items():
        service = named(documents, "Service", f"{name}-{role}")
        assert url == f"http://{service['metadata']['name']}.serving.svc:{service['spec']['ports'][0]['port']}"
    # The admin token is read from a Secret, never written out.
    assert admin_token(deployment) not in text
    env = environment(router["env"])
    assert env["PDSERVE_ROUTER_ADMIN_TOKEN"] == {
        "secretKeyRef": {"name": f"{name}-router", "key": "admin-token"}}
    # The worker key is never written out: the router and every worker read it from the Secret.
    assert deployment_worker_key(deployment.name) not in text
    worker_key = {"secretKeyRef": {"name": f"{name}-router", "key": "worker-key"}}
    assert env["PDSERVE_WORKER_KEY"] == worker_key
    for role in ("prefill", "decode"):
        assert environment(container(named(documents, "Deployment", f"{name}-{role}"))["env"])[
            "VLLM_API_KEY"] == worker_key
    assert {k: v for k, v in env.items()
            if k not in ("PDSERVE_ROUTER_ADMIN_TOKEN", "PDSERVE_WORKER_KEY")} == {
        k: v for k, v in supervisor["router"].env.items()
        if k not in ("PDSERVE_ROUTER_ADMIN_TOKEN", "PDSERVE_WORKER_KEY", "REDIS_URL")}
    assert router["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    router_service = named(documents, "Service", f"{name}-router")
    assert router_service["spec"]["ports"][0]["port"] == deployment.router_port

    rules = named(documents, "PrometheusRule", f"{name}-alerts")["spec"]["groups"]
    expected = yaml.safe_load(render_rule_file(AlertRule.objects.filter(deployment=deployment)))
    assert rules == expected["groups"] and rules[0]["rules"]


def test_a_colocated_plan_has_one_pool_behind_the_router(tmp_path: Path) -> None:
    deployment = make_plan(tmp_path, name="solo")
    deployment.workers.filter(role="decode").delete()
    deployment.workers.filter(role="prefill").update(role="colocated")
    Deployment.objects.filter(pk=deployment.pk).update(mode=Deployment.Mode.COLOCATED)
    deployment.refresh_from_db()
    _, documents = export(deployment)
    supervisor = {spec.slot: spec for spec in process_specs(deployment)}
    workload = assert_runs_the_supervisors_worker(documents, "solo", "default",
                                                  supervisor["colocated-0"])
    assert "kv" not in {v["name"] for v in workload["spec"]["template"]["spec"]["volumes"]}
    router = container(named(documents, "Deployment", "solo-router"))
    port = deployment.workers.get().port
    assert build_parser().parse_args(router["command"][3:]).colocated_urls == [
        f"http://solo-colocated.default.svc:{port}"]
    assert not [d for d in documents if d["kind"] == "LeaderWorkerSet"]


def test_a_two_node_gpu_plan_gets_gpu_pods_and_spans_nodes_as_leader_worker_sets(
        tmp_path: Path) -> None:
    deployment = two_node_gpu_plan(tmp_path)
    supervisor = {spec.slot: spec for spec in process_specs(deployment)}

    # Every instance fits a node of the plan: one pod each, with its GPUs.
    out = StringIO()
    call_command("export-k8s", deployment.name, "--out", str(tmp_path / "k8s"), stdout=out)
    written = tmp_path / "k8s" / "gpu-pd.yaml"
    assert out.getvalue() == f"wrote {written}\n"
    documents = [d for d in yaml.safe_load_all(written.read_text()) if d is not None]
    for document in documents:
        validate(document)
    for role, gpus, replicas in (("prefill", 4, 1), ("decode", 2, 2)):
        workload = assert_runs_the_supervisors_worker(documents, "gpu-pd", "default",
                                                      supervisor[f"{role}-0"], gpus)
        assert workload["spec"]["replicas"] == replicas
        # No cores pinned: none requested; host memory is the runtime, the weights on the GPU.
        assert container(workload)["resources"]["limits"] == {
            "memory": f"{math.ceil(CPU_RUNTIME_BYTES / 2**20)}Mi", "nvidia.com/gpu": str(gpus)}
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"

    # Nodes of two GPUs: prefill's four GPUs span a group of two pods, decode still fits one.
    _, documents = export(deployment, "--gpus-per-node", "2")
    assert not [d for d in documents if d["metadata"]["name"] == "gpu-pd-prefill"
                and d["kind"] == "Deployment"]
    lws = named(documents, "LeaderWorkerSet", "gpu-pd-prefill")
    assert lws["spec"]["replicas"] == 1
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    [leader] = group["leaderTemplate"]["spec"]["containers"]
    [follower] = group["workerTemplate"]["spec"]["containers"]
    # The supervisor runs prefill's four GPUs as one tensor-parallel group; a group of two pods
    # runs them as two pipeline stages of two GPUs each, on Ray.
    supervisor_argv = pod_worker_argv(supervisor["prefill-0"])
    assert supervisor_argv[-4:] == ["--tensor-parallel-size", "4",
                                    "--distributed-executor-backend", "mp"]
    assert leader["args"] == [*supervisor_argv[:-4],
                              "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
                              "--distributed-executor-backend", "ray"]
    assert leader["command"][:2] == ["sh", "-c"] and "ray start --head" in leader["command"][2]
    assert "$LWS_LEADER_ADDRESS" in follower["command"][2]
    for pod in (leader, follower):
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert environment(pod["env"][1:]) == pod_worker_env(supervisor["prefill-0"], 2, "gpu-pd")
    service = named(documents, "Service", "gpu-pd-prefill")
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert named(documents, "Deployment", "gpu-pd-decode")["spec"]["replicas"] == 2

    with pytest.raises(CommandError, match="--gpus-per-node: a prefill instance uses 4 GPUs"):
        export(deployment, "--gpus-per-node", "3")


def test_the_schemas_refuse_what_kubernetes_would(tmp_path: Path) -> None:
    """The validation above is not vacuous: a misspelt field fails each kind of schema."""
    deployment = two_node_gpu_plan(tmp_path)
    _, documents = export(deployment, "--gpus-per-node", "2")
    for kind in ("Deployment", "Service", "LeaderWorkerSet", "PrometheusRule"):
        document = next(d for d in documents if d["kind"] == kind)
        broken = {**document, "spec": {**document["spec"], "replica": 1}}
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_bad_input_is_refused_naming_the_argument(tmp_path: Path) -> None:
    deployment = make_plan(tmp_path)
    with pytest.raises(CommandError, match="DEPLOYMENT: no deployment is named 'nosuch'"):
        call_command("export-k8s", "nosuch", stdout=StringIO())
    with pytest.raises(CommandError, match="--namespace: 'Bad_NS'"):
        call_command("export-k8s", deployment.name, "--namespace", "Bad_NS", stdout=StringIO())
    with pytest.raises(CommandError, match="--gpus-per-node"):
        call_command("export-k8s", deployment.name, "--gpus-per-node", "0", stdout=StringIO())
    with pytest.raises(CommandError, match="--image"):
        call_command("export-k8s", deployment.name, "--image", "two words", stdout=StringIO())
    (tmp_path / "file").write_text("")
    with pytest.raises(CommandError, match="--out: .* is not a directory"):
        call_command("export-k8s", deployment.name, "--out", str(tmp_path / "file"),
                     stdout=StringIO())
    # A name that begins with a digit names no Service.
    Deployment.objects.filter(pk=deployment.pk).update(name="9lives")
    with pytest.raises(CommandError, match="DEPLOYMENT: '9lives' makes no Kubernetes name"):
        call_command("export-k8s", "9lives", stdout=StringIO())


def test_a_pool_of_gpu_and_cpu_instances_is_refused(tmp_path: Path) -> None:
    deployment = two_node_gpu_plan(tmp_path)
    deployment.workers.filter(role="decode", index=1).update(gpu_indices="", cpu_cores="0")
    with pytest.raises(CommandError, match="DEPLOYMENT: the decode pool has GPU and CPU"):
        call_command("export-k8s", deployment.name, stdout=StringIO())


# ---- the gateway -----------------------------------------------------------------------------


def export_gateway(*args: str) -> tuple[str, list[dict[str, Any]]]:
    out = StringIO()
    call_command("export-k8s", "--gateway", *args, stdout=out)
    documents = [d for d in yaml.safe_load_all(out.getvalue()) if d is not None]
    for document in documents:
        validate(document)
    return out.getvalue(), documents


def test_the_gateway_is_replicas_behind_a_service_routing_to_the_routers_services(
        tmp_path: Path, settings: Any, owner: User) -> None:
    pd = make_plan(tmp_path, name="pd", concurrency=5)  # one decode instance
    solo = two_node_gpu_plan(tmp_path)  # two decode instances
    Deployment.objects.filter(pk=solo.pk).update(concurrency=4, served_model_name="big")
    key, _secret = create_key(name="k", team=pd.team, deployments=[pd], all_deployments=False,
                              limits={}, user=owner)
    settings.PDSERVE_GATEWAY_REPLICAS = 3
    text, documents = export_gateway("--namespace", "serving", "--image", "reg/pdserve:1")
    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [
        ("Secret", "pdserve-gateway-config"), ("Deployment", "pdserve-gateway"),
        ("Service", "pdserve-gateway")]
    assert "Secret pdserve-gateway: admin-token" in text

    # Its configuration: the console's, with the routers' Services and each replica's share of
    # the plan's in-flight limit (concurrency x instances that generate, divided, rounded up).
    secret = named(documents, "Secret", "pdserve-gateway-config")
    with pytest.raises(jsonschema.ValidationError):  # the Secret's schema is checked too
        validate({**secret, "stringdata": secret["stringData"]})
    config = parse_config(json.loads(secret["stringData"]["config.json"]))
    by_name = {d.name: d for d in config.deployments}
    assert by_name["pd"].router == f"http://pd-router.serving.svc:{pd.router_port}"
    assert by_name["gpu-pd"].router == f"http://gpu-pd-router.serving.svc:{solo.router_port}"
    assert (by_name["pd"].max_concurrency, by_name["gpu-pd"].max_concurrency) == (
        math.ceil(5 / 3), math.ceil(4 * 2 / 3))
    assert [(k.id, k.hash, k.deployments) for k in config.keys] == [
        (str(key.pk), key.key_hash, frozenset({"pd"}))]

    workload = named(documents, "Deployment", "pdserve-gateway")
    assert workload["spec"]["replicas"] == 3
    template = workload["spec"]["template"]
    # A newer export's configuration rolls the pods (they read it at start).
    assert template["metadata"]["annotations"] == {
        "pdserve.io/gateway-config-version": config.version}
    gateway = container(workload)
    assert gateway["image"] == "reg/pdserve:1"
    settings.PDSERVE_GATEWAY_PORT = 8090
    assert gateway["command"] == with_values(
        ["python3", *gateway_process.command()[1:]],
        {"--host": "0.0.0.0", "--config-file": "/etc/pdserve/gateway/config.json"})
    assert gateway["env"] == [{"name": "PDSERVE_GATEWAY_ADMIN_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "pdserve-gateway", "key": "admin-token"}}}]
    assert gateway_process.admin_token() not in text
    assert template["spec"]["volumes"] == [
        {"name": "config", "secret": {"secretName": "pdserve-gateway-config"}}]
    service = named(documents, "Service", "pdserve-gateway")
    assert service["spec"]["ports"][0]["port"] == 8090
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()

    out = tmp_path / "k8s"
    call_command("export-k8s", "--gateway", "--out", str(out), stdout=StringIO())
    assert (out / "gateway.yaml").read_text().startswith("# pdserve's gateway for Kubernetes")


def test_the_gateway_or_one_deployment_not_both(tmp_path: Path) -> None:
    deployment = make_plan(tmp_path)
    for args in ((), (deployment.name, "--gateway")):
        with pytest.raises(CommandError, match="DEPLOYMENT: name one deployment, or give "
                                                "--gateway instead"):
            call_command("export-k8s", *args, stdout=StringIO())
