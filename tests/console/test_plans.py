"""Deployment plans written over REST and in the browser form: proposals, bad input, atomic saves."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from console.catalog.models import BaseModel, Variant
from console.control import lifecycle
from console.control.worker_specs import router_argv
from console.deployments.models import Deployment, WorkerPlan
from console.deployments.plans import InstanceInput, PlanInput, PoolInput
from console.fleet.models import Node
from console.fleet.services import local_node
from inference.router.config import PD_POLICIES, build_parser, config_from_args
from inference.router.policies import POLICY_NAMES
from tests.console.tiny_models import free_port, make_plan, register

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/"


@pytest.fixture
def variant(tmp_path: Path) -> Variant:
    return register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")


def plan_body(variant: Variant, **changes: Any) -> dict[str, Any]:
    """A minimal plan: everything not given is a default or proposed."""
    body: dict[str, Any] = {
        "name": "tiny-pd", "base_model": "tiny", "served_model_name": "tiny",
        "max_model_len": 2048, "longest_request": 1024, "dtype": "bfloat16",
        "sampling_defaults": {"temperature": 0},
        "prefill": {"variant": variant.pk, "instances": [{}]},
        "decode": {"variant": "tiny/bf16", "instances": [{}, {}]},
        "router": {"port": free_port()},
    }
    body.update(changes)
    return body


def counts() -> tuple[int, int]:
    return Deployment.objects.count(), WorkerPlan.objects.count()


# ---- creating and editing over REST ----------------------------------------------------------


def test_a_plan_is_created_with_free_ports_and_devices_proposed(api: APIClient,
                                                                variant: Variant) -> None:
    response = api.post(URL, plan_body(variant), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    workers = {w["slot"]: w for w in body["workers"]}
    assert set(workers) == {"prefill-0", "decode-0", "decode-1"}
    ports = [w["port"] for w in workers.values()] + [w["side_channel_port"] for w in workers.values()]
    assert len(set(ports)) == 6  # no collisions
    assert workers["prefill-0"]["port"] >= 8100 and workers["decode-0"]["port"] >= 8200
    assert all(w["node"] == local_node().name and w["cpu_cores"] for w in workers.values())
    # The least used core first: prefill and the first decode get different cores.
    assert workers["prefill-0"]["cpu_cores"] != workers["decode-0"]["cpu_cores"]
    # The checks ran when the plan was saved. Three workers on this 2-core machine must share a
    # core; the proposal does not declare sharing on the operator's behalf, the check says so.
    errors = {r["id"] for r in body["checks"]["results"] if r["severity"] == "error"}
    assert errors <= {"device.conflict"}
    assert [c["id"] for c in body["checks"]["checks"]][:2] == ["model.same_base", "model.path"]


def test_the_router_port_is_proposed_too(api: APIClient, variant: Variant,
                                         deployment: Deployment) -> None:
    body = plan_body(variant)
    del body["router"]
    response = api.post(URL, body, format="json")
    assert response.status_code == 201
    router = response.json()["router"]["port"]
    # The default deployment plans 8080; the new router and workers avoid each other.
    assert router != deployment.router_port
    assert router not in {w["port"] for w in response.json()["workers"]}


def test_proposals_skip_ports_that_are_held_right_now(api: APIClient, variant: Variant) -> None:
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            held.bind(("127.0.0.1", 8100))
        except OSError:
            pass  # already held by something else: the proposal must skip it all the same
        else:
            held.listen()
        response = api.post(URL, plan_body(variant), format="json")
    assert response.status_code == 201
    prefill = next(w for w in response.json()["workers"] if w["slot"] == "prefill-0")
    assert prefill["port"] != 8100


def test_explicit_values_are_kept_and_proposals_avoid_them(api: APIClient,
                                                           variant: Variant) -> None:
    port = free_port()
    body = plan_body(variant, decode={"variant": variant.pk, "instances": [
        {"port": port, "cpu_cores": "1"}, {}]})
    response = api.post(URL, body, format="json")
    assert response.status_code == 201
    workers = {w["slot"]: w for w in response.json()["workers"]}
    assert (workers["decode-0"]["port"], workers["decode-0"]["cpu_cores"]) == (port, "1")
    assert workers["decode-1"]["port"] != port


def test_a_plan_is_edited_with_put_and_patch(api: APIClient, variant: Variant) -> None:
    created = api.post(URL, plan_body(variant), format="json").json()
    url = f"{URL}{created['id']}/"
    patched = api.patch(url, {"max_model_len": 4096, "kv_channel": "nixl", "block_size": 128},
                        format="json")
    assert patched.status_code == 200, patched.content
    body = patched.json()
    assert (body["max_model_len"], body["kv_channel"], body["block_size"]) == (4096, "nixl", 128)
    assert len(body["workers"]) == 3  # a partial update leaves the pools alone

    put = api.put(url, plan_body(variant, decode={"variant": variant.pk, "instances": [{}]}),
                  format="json")
    assert put.status_code == 200
    assert [w["slot"] for w in put.json()["workers"]] == ["decode-0", "prefill-0"]


def test_routing_policies_are_stored_and_reach_the_router_command(api: APIClient,
                                                                   variant: Variant) -> None:
    router = {"port": free_port(), "prefill_policy": "prefix_aware", "decode_policy": "round_robin",
              "pd_policy": "remote", "stall_budget_ms": 400, "degraded_mode": False}
    created = api.post(URL, plan_body(variant, router=router), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["router"] == {"host": "127.0.0.1", **router}
    deployment = Deployment.objects.get(pk=created.json()["id"])
    workers = list(deployment.workers.select_related("variant"))
    argv = router_argv(deployment, workers)
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--prefill-policy"] == "prefix_aware"
    assert flags["--decode-policy"] == "round_robin"
    assert flags["--pd-policy"] == "remote"
    assert flags["--stall-budget-ms"] == "400"
    assert "--no-degraded-mode" in argv
    assert flags["--prefix-block-size"] == "128"  # the CPU engine's KV block
    # Shared storage has no handshake to warm.
    assert "--kv-warmup-tokens" not in flags
    # The router itself accepts what the console passes.
    config_from_args(build_parser().parse_args(argv[3:]))


def test_a_nixl_plan_has_the_router_warm_each_pair_before_it_serves(api: APIClient,
                                                                    variant: Variant) -> None:
    created = api.post(URL, plan_body(variant, kv_channel="nixl", max_model_len=2048),
                       format="json")
    assert created.status_code == 201, created.content
    deployment = Deployment.objects.get(pk=created.json()["id"])
    argv = router_argv(deployment, list(deployment.workers.select_related("variant")))
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--kv-channel"] == "nixl"
    assert flags["--kv-warmup-tokens"] == "256"  # two of the CPU engine's 128-token blocks
    assert config_from_args(build_parser().parse_args(argv[3:])).kv_warmup_tokens == 256


def test_the_console_offers_exactly_the_router_policies() -> None:
    assert set(Deployment.RoutingPolicy.values) == set(POLICY_NAMES)
    assert set(Deployment.PDPolicy.values) == set(PD_POLICIES)


def test_patching_the_mode_replaces_the_pools_it_no_longer_uses(api: APIClient,
                                                               variant: Variant) -> None:
    url = f"{URL}{api.post(URL, plan_body(variant), format='json').json()['id']}/"
    before = counts()
    response = api.patch(url, {"mode": "colocated"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"colocated": ["a colocated plan needs at least one colocated "
                                             "instance"]}
    assert counts() == before

    response = api.patch(url, {"mode": "colocated", "colocated": {
        "variant": variant.pk, "instances": [{}]}}, format="json")
    assert response.status_code == 200, response.content
    assert [w["slot"] for w in response.json()["workers"]] == ["colocated-0"]


def test_saving_a_running_plan_with_errors_is_refused_and_nothing_changes(
    api: APIClient, tmp_path: Path
) -> None:
    plan = make_plan(tmp_path, desired_state=Deployment.DesiredState.RUNNING)
    prefill = plan.workers.get(role="prefill")
    before = list(plan.workers.values_list("role", "index", "port"))
    response = api.patch(f"{URL}{plan.pk}/", {"decode": {"variant": "tiny/bf16", "instances": [
        {"port": prefill.port}]}}, format="json")
    assert response.status_code == 409
    assert [r["id"] for r in response.json()["results"]] == ["port.conflict"]
    assert list(plan.workers.values_list("role", "index", "port")) == before


# ---- bad input: 400 on the field, nothing half-saved ----------------------------------------


@pytest.mark.parametrize(("changes", "field"), [
    ({"router": {"port": 0}}, "router"),
    ({"router": {"port": 70000}}, "router"),
    ({"router": {"port": "eighty"}}, "router"),
    ({"max_model_len": -1}, "max_model_len"),
    ({"max_model_len": 10**9}, "max_model_len"),
    ({"max_model_len": "long"}, "max_model_len"),
    ({"longest_request": 0}, "longest_request"),
    ({"kv_cache_gib": 0}, "kv_cache_gib"),
    ({"block_size": 17}, "block_size"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype"),
    ({"engine_version": "latest"}, "engine_version"),
    ({"sampling_defaults": {"temperature": "hot"}}, "sampling_defaults"),
    ({"sampling_defaults": {"beam_width": 4}}, "sampling_defaults"),
    ({"name": "new"}, "name"),
    ({"name": "Has Spaces"}, "name"),
    ({"base_model": "nope"}, "base_model"),
    ({"decode": {"variant": "tiny/nope", "instances": [{}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": []}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"port": 0}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"port": 70000}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"port": "abc"}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"side_channel_port": 99999}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"cpu_cores": "0-3"}]}}, "decode"),
    ({"decode": {"variant": 1, "instances": [{"node": "nowhere"}]}}, "decode"),
    ({"colocated": {"variant": 1, "instances": [{}]}}, "colocated"),
    ({"router": {"prefill_policy": "fastest"}}, "router"),
    ({"router": {"pd_policy": "always"}}, "router"),
    ({"router": {"stall_budget_ms": 0}}, "router"),
    # Parallelism follows from each instance's GPUs, and the plan sets its own flags.
    ({"extra_engine_args": ["--tensor-parallel-size", "2"]}, "extra_engine_args"),
    ({"extra_engine_args": ["--max-num-seqs", "4", "-pp=2"]}, "extra_engine_args"),
    ({"extra_engine_args": ["--distributed-executor-backend", "ray"]}, "extra_engine_args"),
    ({"extra_engine_args": ["--port=9000"]}, "extra_engine_args"),
])
def test_bad_input_is_400_on_its_field_and_nothing_is_saved(
    api: APIClient, variant: Variant, changes: dict[str, Any], field: str
) -> None:
    before = counts()
    response = api.post(URL, plan_body(variant, **changes), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert counts() == before


def test_errors_inside_a_pool_name_the_instance_and_field(api: APIClient,
                                                          variant: Variant) -> None:
    response = api.post(URL, plan_body(variant, decode={"variant": variant.pk, "instances": [
        {}, {"port": 70000}]}), format="json")
    assert response.json()["decode"]["instances"]["1"]["port"] == ["port 70000 is outside 1-65535"]


def test_a_pd_plan_needs_both_pools(api: APIClient, variant: Variant) -> None:
    body = plan_body(variant)
    del body["decode"]
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["decode"] == ["a pd plan needs at least one decode instance"]


def test_duplicate_names_are_refused(api: APIClient, variant: Variant) -> None:
    assert api.post(URL, plan_body(variant), format="json").status_code == 201
    before = counts()
    response = api.post(URL, plan_body(variant), format="json")
    assert response.status_code == 400
    assert "name" in response.json()
    assert counts() == before


def test_a_worker_failing_after_the_plan_row_was_written_saves_nothing(variant: Variant) -> None:
    # The serializer and the form catch this earlier; the service must hold on its own too.
    before = counts()
    plan = PlanInput(
        fields={"name": "half", "base_model": variant.base, "served_model_name": "half"},
        pools={"prefill": PoolInput(variant, [InstanceInput()]),
               "decode": PoolInput(variant, [InstanceInput(), InstanceInput(port=70000)])})
    with pytest.raises(ValidationError) as excinfo:
        lifecycle.save(plan)
    assert excinfo.value.message_dict == {"decode.instances.1.port": [
        "port 70000 is outside 1-65535"]}
    assert counts() == before


# ---- the browser form ------------------------------------------------------------------------


@pytest.fixture
def browser(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def form_data(variant: Variant, node: Node, **changes: str) -> dict[str, str]:
    data = {
        "name": "tiny-form", "base_model": str(variant.base_id), "served_model_name": "tiny",
        "mode": "pd", "max_model_len": "2048", "longest_request": "1024", "concurrency": "8",
        "ttft_slo_ms": "2000", "tpot_slo_ms": "200",
        "kv_channel": "shared-storage", "kv_cache_gib": "1", "block_size": "",
        "kv_cache_dtype": "auto", "dtype": "bfloat16", "engine_version": node.engine_version,
        "sampling_defaults": '{"temperature": 0}', "router_port": str(free_port()),
        "prefill_policy": "least_outstanding", "decode_policy": "least_outstanding",
        "pd_policy": "pd_adaptive", "stall_budget_ms": "250", "degraded_mode": "on",
        "kv_load_failure": "fail", "gate_mode": "auto", "gate_prompts": "8", "gate_min_agreement": "0.9",
        "gate_max_mean_delta": "0.5", "gate_action": "block", "max_images_per_prompt": "1",
        "max_image_bytes": str(2 * 1024 * 1024), "max_image_pixels": str(4096 * 4096),
    }
    for role, core in (("prefill", node.cpu_ids[0]), ("decode", node.cpu_ids[-1]),
                       ("colocated", None)):
        data[f"{role}-variant"] = str(variant.pk)
        count = 0 if core is None else 1
        data.update({f"{role}-instances-TOTAL_FORMS": str(count),
                     f"{role}-instances-INITIAL_FORMS": "0"})
        if count:
            data.update({f"{role}-instances-0-node": str(node.pk),
                         f"{role}-instances-0-cpu_cores": str(core),
                         f"{role}-instances-0-port": str(free_port()),
                         f"{role}-instances-0-side_channel_port": str(free_port())})
    data.update(changes)
    return data


def test_a_new_form_starts_with_one_prefill_and_one_decode_proposed(browser: Client,
                                                                    deployment: Deployment) -> None:
    html = browser.get("/deployments/new/").content.decode()
    assert 'name="prefill-instances-TOTAL_FORMS" value="1"' in html
    assert 'name="decode-instances-TOTAL_FORMS" value="1"' in html
    assert 'name="prefill-instances-0-port" value="8100"' not in html  # the default plan's
    assert 'name="router_port" value="8080"' not in html


def test_the_form_creates_a_plan_and_shows_it(browser: Client, variant: Variant) -> None:
    assert browser.get("/deployments/new/").status_code == 200
    response = browser.post("/deployments/new/", form_data(variant, local_node()))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert response["Location"] == "/deployments/tiny-form/"
    html = browser.get("/deployments/tiny-form/").content.decode()
    assert '<tr data-worker="prefill-0">' in html
    assert 'data-check="port.bound" data-status="pass"' in html


def test_the_form_shows_bad_input_on_its_field_and_saves_nothing(browser: Client,
                                                                 variant: Variant) -> None:
    before = counts()
    data = form_data(variant, local_node(), **{"decode-instances-0-port": "70000",
                                               "max_model_len": "-5"})
    response = browser.post("/deployments/new/", data)
    assert response.status_code == 400
    html = response.content.decode()
    assert "port 70000 is outside 1-65535" in html
    assert "Ensure this value is greater than or equal to 16." in html
    assert counts() == before


def test_the_form_edits_a_plan_and_keeps_its_name(browser: Client, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    page = browser.get(f"/deployments/{plan.name}/edit/")
    assert page.status_code == 200
    assert 'data-check="kv.geometry"' in page.content.decode()  # checks shown on opening
    variant = Variant.objects.get(name="bf16")
    data = form_data(variant, local_node(), name="renamed", max_model_len="3000",
                     longest_request="3000")
    assert browser.post(f"/deployments/{plan.name}/edit/", data).status_code == 302
    plan.refresh_from_db()
    assert (plan.name, plan.max_model_len) == ("tiny-1p1d", 3000)


def test_the_live_check_panel_follows_the_unsaved_form(browser: Client, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    variant = Variant.objects.get(name="bf16")
    data = form_data(variant, local_node())
    data["decode-instances-0-port"] = data["prefill-instances-0-port"]
    response = browser.post(f"/deployments/{plan.name}/edit/check/", data)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-check="port.conflict" data-status="error"' in html
    assert "<html" not in html  # a fragment the page swaps in
    assert not WorkerPlan.objects.filter(deployment=plan, port=int(data["decode-instances-0-port"]),
                                         role="decode").exists()

    data["max_model_len"] = "nonsense"
    html = browser.post(f"/deployments/{plan.name}/edit/check/", data).content.decode()
    assert 'id="form-errors"' in html and "Context length: Enter a whole number." in html


def test_adding_an_instance_proposes_values_the_form_does_not_use(browser: Client,
                                                                  variant: Variant) -> None:
    node = local_node()
    data = {**form_data(variant, node), "role": "decode", "node": str(node.pk)}
    response = browser.post("/deployments/new/propose/", data)
    assert response.status_code == 200
    proposal = response.json()
    taken = {int(v) for k, v in data.items() if k.endswith("port") and v}
    assert proposal["port"] not in taken and proposal["side_channel_port"] not in taken
    assert proposal["node"] == node.pk
    assert proposal["cpu_cores"] != "" and proposal["gpu_indices"] == ""
