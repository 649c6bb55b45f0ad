"""One gateway, one endpoint, in front of the deployments of one console: the borrowed
prefill/decode deployment and a colocated one added beside it, each a real tiny-model vLLM
deployment, driven with the official `openai` client.

What a client of several models meets: each deployment by its served name, streamed and not;
an alias; /v1/models as its key may see it; 404 for a model it may not use, the same as for one
that does not exist; 401 without a key where one is needed; and an alias whose first deployment
stops, served by the next one, the answer naming which.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.borrowed import NAME, Handle, devices_shared
from tests.console.sockets import free_port

pytestmark = pytest.mark.vllm

COLOCATED, COLOCATED_MODEL = "gw-colocated", "tiny-colocated"
CLOSED, CLOSED_MODEL = "gw-closed", "tiny-closed"
ALIAS = "chat"
# The plan `manage.py bootstrap` makes in every console, never started here: open, stopped.
DEFAULT_MODEL = "smollm2"
PROMPT = "The capital of France is"


def _colocated_plan(name: str, served: str) -> dict[str, Any]:
    return {"name": name, "base_model": "tiny", "served_model_name": served, "mode": "colocated",
            "max_model_len": 2048, "longest_request": 2048, "kv_cache_gib": 1,
            "dtype": "float32", "sampling_defaults": {"temperature": 0},
            "colocated": {"variant": "tiny/f32", "instances": [
                {"cpu_cores": "1", "port": free_port(), "share_devices": True}]},
            "router": {"port": free_port()}}


def _created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 201, response.text
    return dict(response.json())


def _wait(condition: Callable[[], Any], what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.5)
    return found


def _listed(handle: Handle, key: str | None) -> dict[str, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{handle.gateway}/v1/models", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return {entry["id"]: entry for entry in response.json()["data"]}


def _state(handle: Handle, deployment_id: int) -> str:
    return str(handle.call("GET", f"/api/v1/deployments/{deployment_id}/").json()["state"])


def test_one_endpoint_serves_each_deployment_by_name_and_alias_as_its_key_allows(
        borrowed: Handle) -> None:
    handle = borrowed
    made: list[int] = []
    keys: list[int] = []
    alias_id = None
    with devices_shared(handle):
        try:
            colocated = _created(handle.call("POST", "/api/v1/deployments/",
                                             json=_colocated_plan(COLOCATED, COLOCATED_MODEL)))
            made.append(colocated["id"])
            assert colocated["checks"]["ok"], colocated["checks"]
            # Planned, never started, and closed by a key of its own: a model this test's key
            # may not use.
            made.append(_created(handle.call("POST", "/api/v1/deployments/", json=_colocated_plan(
                CLOSED, CLOSED_MODEL)))["id"])
            assert handle.call("POST", f"/api/v1/deployments/{colocated['id']}/start").status_code == 202
            own = _created(handle.call("POST", "/api/v1/keys/", json={
                "name": "gateway-client", "deployments": [COLOCATED]}))
            other = _created(handle.call("POST", "/api/v1/keys/", json={
                "name": "gateway-other", "deployments": [CLOSED]}))
            keys += [own["id"], other["id"]]
            alias_id = _created(handle.call("POST", "/api/v1/aliases/", json={
                "name": ALIAS, "targets": [COLOCATED, NAME]}))["id"]
            key = own["key"]

            _wait(lambda: _state(handle, colocated["id"]) == "ready", "the colocated deployment",
                  420)
            # The gateway hears of the new router within one sync round.
            listed = _wait(lambda: (found := _listed(handle, key)).get(COLOCATED_MODEL, {}).get(
                "pdserve", {}).get("state") == "running" and found, "the gateway to list it", 30)
            opened = {handle.served_model_name, DEFAULT_MODEL, ALIAS}
            assert set(listed) == opened | {COLOCATED_MODEL}
            assert listed[ALIAS]["pdserve"]["alias_of"] == [COLOCATED, NAME]
            assert listed[handle.served_model_name]["pdserve"] == {"deployment": NAME,
                                                                   "state": "running"}
            assert listed[DEFAULT_MODEL]["pdserve"]["state"] == "stopped"
            # Each key sees its own; without one, only what is open (the borrowed deployment
            # has no key, as its own router has none).
            assert set(_listed(handle, other["key"])) == opened | {CLOSED_MODEL}
            assert set(_listed(handle, None)) == opened

            client = openai.OpenAI(base_url=f"{handle.gateway}/v1", api_key=key, max_retries=0,
                                   timeout=120)
            raw = client.completions.with_raw_response.create(
                model=COLOCATED_MODEL, prompt=PROMPT, max_tokens=4)
            assert raw.headers["x-pdserve-deployment"] == COLOCATED
            completion = raw.parse()
            assert completion.model == COLOCATED_MODEL and completion.usage.completion_tokens == 4
            # The same request through the colocated deployment's own port: the same answer.
            direct = httpx.post(f"{colocated['router_url']}/v1/completions", timeout=120,
                                headers={"Authorization": f"Bearer {key}"},
                                json={"model": COLOCATED_MODEL, "prompt": PROMPT, "max_tokens": 4})
            assert direct.json()["choices"][0]["text"] == completion.choices[0].text

            stream = client.chat.completions.create(
                model=handle.served_model_name, stream=True, max_tokens=6,
                messages=[{"role": "user", "content": "Say hello"}],
                stream_options={"include_usage": True})
            assert stream.response.headers["x-pdserve-deployment"] == NAME
            chunks = list(stream)
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
            assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1

            by_alias = client.chat.completions.with_raw_response.create(
                model=ALIAS, max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
            assert by_alias.headers["x-pdserve-deployment"] == COLOCATED
            assert by_alias.parse().usage.completion_tokens == 3

            # A model the key may not use is answered like one that does not exist.
            refused = []
            for model in (CLOSED_MODEL, "no-such-model"):
                with pytest.raises(openai.NotFoundError) as caught:
                    client.completions.create(model=model, prompt=PROMPT, max_tokens=2)
                refused.append(caught.value.body)
                assert caught.value.body["code"] == "model_not_found"
                assert model in caught.value.body["message"]
            assert refused[0]["message"].replace(CLOSED_MODEL, "X") == \
                refused[1]["message"].replace("no-such-model", "X")
            # Without a key (the openai client always sends one), as its own router answers.
            keyless = httpx.post(f"{handle.gateway}/v1/completions", timeout=30, json={
                "model": COLOCATED_MODEL, "prompt": PROMPT, "max_tokens": 2})
            assert keyless.status_code == 401 and keyless.headers["WWW-Authenticate"] == "Bearer"
            with pytest.raises(openai.AuthenticationError):
                client.with_options(api_key=own["key"][:-3] + "abc").completions.create(
                    model=COLOCATED_MODEL, prompt=PROMPT, max_tokens=2)

            # Its first deployment stopped, the alias is served by the next one.
            assert handle.call("POST", f"/api/v1/deployments/{colocated['id']}/stop").status_code == 202
            _wait(lambda: _state(handle, colocated["id"]) == "stopped", "the colocated stop", 90)
            fallback = client.chat.completions.with_raw_response.create(
                model=ALIAS, max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
            assert fallback.headers["x-pdserve-deployment"] == NAME
            assert fallback.parse().usage.completion_tokens == 3
            # And the borrowed deployment's own port serves as before.
            assert handle.complete().status_code == 200
        finally:
            if alias_id is not None:
                handle.call("DELETE", f"/api/v1/aliases/{alias_id}/")
            for key_id in keys:
                handle.call("POST", f"/api/v1/keys/{key_id}/revoke")
            for deployment_id in made:
                handle.call("POST", f"/api/v1/deployments/{deployment_id}/stop")
                _wait(lambda d=deployment_id: _state(handle, d) == "stopped", "a stop", 90)
                assert handle.call("DELETE", f"/api/v1/deployments/{deployment_id}/").status_code == 204
