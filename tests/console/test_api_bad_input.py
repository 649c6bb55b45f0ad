"""Regression tests for the server errors schemathesis found (issue 11): each input that once
answered 500 is now a 400 naming the field or parameter."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from console.api_errors import exception_handler
from console.fleet.models import GIB, MAX_GPU_MEMORY_BYTES, MAX_NODE_MEMORY_BYTES, Node
from console.pagination import MAX_LIMIT, MAX_OFFSET

pytestmark = pytest.mark.django_db

NODE = {"name": "gpu-b", "address": "10.0.0.2", "cpu_count": 4, "memory_gib": 16}
LISTS = ["/api/v1/keys/", "/api/v1/models/", "/api/v1/nodes/", "/api/v1/variants/",
         "/api/v1/deployments/", "/api/v1/processes/"]


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


@pytest.mark.parametrize("path", LISTS)
def test_a_20_digit_limit_and_a_negative_offset_are_400_naming_each(api: APIClient, path: str) -> None:
    # Found as GET ...?limit=<20 digits>&offset=-194: the limit overflowed SQLite's integers.
    response = api.get(path, {"limit": "12345678901234567890"})
    assert response.status_code == 400 and list(response.json()) == ["limit"], response.content
    response = api.get(path, {"offset": "-194"})
    assert response.status_code == 400 and list(response.json()) == ["offset"], response.content


@pytest.mark.parametrize(("query", "field"), [
    ({"limit": "0"}, "limit"), ({"limit": str(MAX_LIMIT + 1)}, "limit"), ({"limit": "ten"}, "limit"),
    ({"limit": "²"}, "limit"), ({"offset": str(MAX_OFFSET + 1)}, "offset"), ({"offset": "1.5"}, "offset"),
])
def test_limit_and_offset_out_of_bounds_are_400(api: APIClient, query: dict[str, str], field: str) -> None:
    response = api.get("/api/v1/models/", query)
    assert response.status_code == 400 and field in response.json()


def test_limit_and_offset_within_bounds_page_the_list(api: APIClient) -> None:
    for name in ("a", "b", "c"):
        assert api.post("/api/v1/models/", {"name": name}, format="json").status_code == 201
    page = api.get("/api/v1/models/", {"limit": MAX_LIMIT, "offset": 1}).json()
    assert page["count"] == 3 and [m["name"] for m in page["results"]] == ["b", "c"]
    assert api.get("/api/v1/models/", {"offset": MAX_OFFSET}).json()["results"] == []


@pytest.mark.parametrize(("path", "parameter"), [
    ("/api/v1/processes/", "deployment"), ("/api/v1/measurements/", "variant")])
@pytest.mark.parametrize("value", ["²", "123456789012345678901234", "0", "x"])
def test_an_id_filter_that_is_no_id_is_400_naming_it(api: APIClient, path: str, parameter: str,
                                                      value: str) -> None:
    # '²' passed str.isdigit() and failed int(); 24 digits overflowed SQLite.
    response = api.get(path, {parameter: value})
    assert response.status_code == 400 and parameter in response.json(), response.content


@pytest.mark.parametrize("method", ["post", "patch"])
def test_a_gpu_entry_without_its_index_is_400_on_gpus(api: APIClient, method: str) -> None:
    # Found as a KeyError: a PATCH is partial down to the nested entries, so 'index' was skipped.
    node = api.post("/api/v1/nodes/", NODE, format="json").json()
    url = "/api/v1/nodes/" if method == "post" else f"/api/v1/nodes/{node['id']}/"
    body = {**NODE, "name": "gpu-c"} if method == "post" else {}
    response = getattr(api, method)(url, {**body, "gpus": [{"name": "L4", "memory_gib": 24}]},
                                    format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"gpus": {"0": {"index": ["This field is required."]}}}


@pytest.mark.parametrize(("field", "value"), [
    ("memory_gib", MAX_NODE_MEMORY_BYTES / GIB * 1.01),
    ("gpus", [{"index": 0, "memory_gib": MAX_GPU_MEMORY_BYTES / GIB * 1.01}]),
])
def test_memory_beyond_the_models_bound_is_400_not_a_model_error(api: APIClient, field: str,
                                                                 value: object) -> None:
    # Found as a 500: the serializer let through what the model's full_clean then refused.
    response = api.post("/api/v1/nodes/", {**NODE, field: value}, format="json")
    assert response.status_code == 400 and field in response.json(), response.content
    assert not Node.objects.filter(name="gpu-b").exists()


def test_the_largest_memory_the_api_states_is_stored(api: APIClient) -> None:
    response = api.post("/api/v1/nodes/", {
        **NODE, "memory_gib": MAX_NODE_MEMORY_BYTES / GIB,
        "gpus": [{"index": 0, "memory_gib": MAX_GPU_MEMORY_BYTES / GIB}]}, format="json")
    assert response.status_code == 201, response.content
    node = Node.objects.get(name="gpu-b")
    assert (node.memory_bytes, node.gpus.get().memory_bytes) == (MAX_NODE_MEMORY_BYTES,
                                                                 MAX_GPU_MEMORY_BYTES)


def test_a_model_validation_error_is_a_400_keyed_by_its_fields() -> None:
    response = exception_handler(ValidationError({"memory_bytes": ["too much"]}), {})
    assert response is not None and response.status_code == 400
    assert response.data == {"memory_bytes": ["too much"]}
    response = exception_handler(ValidationError("the plan as a whole"), {})
    assert response is not None and response.status_code == 400
    assert response.data == {"non_field_errors": ["the plan as a whole"]}


def test_the_smallest_memory_the_api_states_reads_back_within_its_bounds(api: APIClient) -> None:
    # Found by schemathesis's response check: 0.1 GiB stored truncated read back as 0.0999...
    response = api.post("/api/v1/nodes/", {**NODE, "memory_gib": 0.1}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["memory_gib"] >= 0.1
    node = api.get(f"/api/v1/nodes/{response.json()['id']}/").json()
    assert node["memory_gib"] >= 0.1


def test_an_empty_page_of_json_lines_still_says_it_is_json_lines(api: APIClient) -> None:
    # Found by schemathesis's content-type check: DRF drops the header of an empty body.
    response = api.get("/api/v1/audit/export/", {"format": "jsonl", "action": "nothing.matches"})
    assert response.status_code == 200 and response.content == b""
    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
