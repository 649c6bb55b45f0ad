"""One gateway, one endpoint, in front of the deployments of one console: the borrowed
prefill/decode deployment and a colocated one added beside it, each a real tiny-model vLLM
deployment, driven with the official `openai` client.

What a client of several models meets: each deployment by its served name, streamed and not;
an alias; /v1/models as its key may see it; 404 for a model it may not use, the same as for one
that does not exist; 401 without a key where one is needed; and an alias whose first deployment
stops, served by the next one, the answer naming which.

And while a deployment is saturated: a high-priority trickle keeps its TTFT within the SLO
beside a low-priority flood that is shed with 429, and two teams at one priority are both
served (their shares are printed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from tests.borrowed import NAME, Handle
from tests.borrowed_plan import devices_shared
from tests.console.sockets import free_port
from tests.e2e.polling import expect_created, wait_until

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
            colocated = expect_created(handle.call("POST", "/api/v1/deployments/",
                                             json=_colocated_plan(COLOCATED, COLOCATED_MODEL)))
            made.append(colocated["id"])
            assert colocated["checks"]["ok"], colocated["checks"]
            # Planned, never started, and closed by a key of its own: a model this test's key
            # may not use.
            made.append(expect_created(handle.call("POST", "/api/v1/deployments/", json=_colocated_plan(
                CLOSED, CLOSED_MODEL)))["id"])
            assert handle.call("POST", f"/api/v1/deployments/{colocated['id']}/start").status_code == 202
            own = expect_created(handle.call("POST", "/api/v1/keys/", json={
                "name": "gateway-client", "deployments": [COLOCATED]}))
            other = expect_created(handle.call("POST", "/api/v1/keys/", json={
                "name": "gateway-other", "deployments": [CLOSED]}))
            keys += [own["id"], other["id"]]
            alias_id = expect_created(handle.call("POST", "/api/v1/aliases/", json={
                "name": ALIAS, "targets": [COLOCATED, NAME]}))["id"]
            key = own["key"]

            wait_until(lambda: _state(handle, colocated["id"]) == "ready", "the colocated deployment",
                  420)
            # The gateway hears of the new router within one sync round.
            listed = wait_until(lambda: (found := _listed(handle, key)).get(COLOCATED_MODEL, {}).get(
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
            wait_until(lambda: _state(handle, colocated["id"]) == "stopped", "the colocated stop", 90)
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
                wait_until(lambda d=deployment_id: _state(handle, d) == "stopped", "a stop", 90)
                assert handle.call("DELETE", f"/api/v1/deployments/{deployment_id}/").status_code == 204


# ---- priority and fairness while the deployment is saturated -----------------------------
# The borrowed deployment's limit in the gateway: its plan's concurrency (8) times its one
# decode worker; its console's gateway queue holds 8 (tests/borrowed.py). 20 clients keep the 8
# slots and the 8 places in the queue taken and 4 more shed at any time; 28 did too, but their
# retries took so much of two cores that a high-priority TTFT reached 2.04 s in a whole run.
FLOOD_CLIENTS = 20
TRICKLE_REQUESTS = 20
# A refused client waits this long before it sends again: the gateway's Retry-After (1 s). The
# clients being served send again at once and keep the queue full by themselves; at 0.2 s the
# refused ones' retries took so much of two cores from the gateway that a high-priority first
# token took 3.7 s in a whole run (the router's own first token never above 0.34 s).
RETRY_S = 1.0
# Team b's clients in the fairness phase (team a has twice as many): 4 more than b's half of
# the slots and of the queue.
TEAM_B_CLIENTS = 12
# The borrowed plan's TTFT SLO: the plan's default ttft_slo_ms, 2,000 ms.
TTFT_SLO_S = 2.0
# Requests of one length (the random model may end early otherwise): equal work per request.
ANSWER = {"max_tokens": 16, "ignore_eos": True}


@dataclass
class Tally:
    ok: list[float] = field(default_factory=list)  # completion times, monotonic
    refused: int = 0
    retry_after: set[str] = field(default_factory=set)


async def _flood(client: httpx.AsyncClient, model: str, key: str, tally: Tally,
                 until: Callable[[], bool]) -> None:
    """One client sending back to back until ``until()``; a refused request is sent again after
    RETRY_S (a client that honoured Retry-After would only make the flood smaller)."""
    headers = {"Authorization": f"Bearer {key}"}
    while not until():
        response = await client.post("/v1/completions", headers=headers, json={
            "model": model, "prompt": PROMPT, **ANSWER})
        if response.status_code == 200:
            tally.ok.append(time.monotonic())
        else:
            assert response.status_code == 429, response.text
            assert response.json()["error"]["code"] in ("queue_full", "shed")
            tally.refused += 1
            tally.retry_after.add(response.headers["Retry-After"])
            await asyncio.sleep(RETRY_S)


async def _ttft(client: httpx.AsyncClient, model: str, key: str) -> float:
    """Seconds to the first streamed token of one request."""
    started = time.monotonic()
    async with client.stream("POST", "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"model": model, "prompt": PROMPT, "stream": True, **ANSWER}
                             ) as response:
        assert response.status_code == 200, await response.aread()
        first = None
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic() - started
        assert first is not None
        return first


async def _watch(client: httpx.AsyncClient, handle: Handle,
                 done: asyncio.Event) -> list[dict[str, Any]]:
    """The console's traffic rows of the borrowed deployment, read every second until ``done``
    (only readings that came back before it count)."""
    rows: list[dict[str, Any]] = []
    while not done.is_set():
        traffic = (await client.get(f"{handle.console}/api/v1/gateway/traffic/",
                                    headers={"Authorization": f"Token {handle.token}"})).json()
        if not done.is_set():
            [row] = [r for r in traffic["deployments"] if r["deployment"] == NAME]
            rows.append({**row, "gateway": traffic["gateway"]})
        await asyncio.sleep(1)
    return rows


def _held(row: dict[str, Any]) -> dict[str, int]:
    """The slots each team held in one reading of the console's traffic view."""
    held = {flow["flow"]: flow["requests"] for flow in row["in_flight_by_flow"]}
    return {team: held.get(team, 0) for team in ("gw-team-a", "gw-team-b")}


async def _saturate(handle: Handle, keys: dict[str, str]) -> dict[str, Any]:
    model = handle.served_model_name
    async with httpx.AsyncClient(base_url=handle.gateway, timeout=120,
                                 limits=httpx.Limits(max_connections=200)) as client:
        idle = sorted([await _ttft(client, model, keys["interactive"]) for _ in range(3)])
        # A low-priority flood, and a high-priority request every half second beside it; the
        # flood lasts until the last of them is answered, and the console's traffic view is
        # read every second meanwhile (one reading may come late when two cores are this busy).
        flood = Tally()
        trickled = asyncio.Event()
        flooding = [asyncio.create_task(_flood(client, model, keys["batch"], flood,
                                               trickled.is_set))
                    for _ in range(FLOOD_CLIENTS)]
        watching = asyncio.create_task(_watch(client, handle, trickled))
        await asyncio.sleep(5)  # the queue is full before the first high-priority request
        trickle = []
        for _ in range(TRICKLE_REQUESTS):
            trickle.append(await _ttft(client, model, keys["interactive"]))
            await asyncio.sleep(0.5)
        trickled.set()
        await asyncio.gather(*flooding)
        traffic = await watching

        # Two teams at the same priority, one sending twice as much as the other, both more
        # than their half of the slots and of the queue (8 + 8): fairness is owed to flows that
        # keep requests waiting. Team b's clients past 8 are refused while it holds its half
        # (what a flow holds in flight counts when the full queue sheds) and keep its queue
        # from running empty between its answered clients' requests.
        teams = {"a": Tally(), "b": Tally()}
        started = time.monotonic()
        until = started + 30
        competed = asyncio.Event()
        both = [asyncio.create_task(_flood(client, model, keys[f"team-{team}"], teams[team],
                                           lambda: time.monotonic() >= until))
                for team, clients in (("a", 2 * TEAM_B_CLIENTS), ("b", TEAM_B_CLIENTS))
                for _ in range(clients)]
        await asyncio.sleep(5)
        # The console's traffic view, read while both teams keep requests waiting.
        holding = asyncio.create_task(_watch(client, handle, competed))
        await asyncio.gather(*both)
        competed.set()
        slots = await holding
    # Counted after the first 5 s, when both teams have been waiting for a while.
    shares = {team: sum(1 for at in tally.ok if at > started + 5) for team, tally in teams.items()}
    return {"idle": idle, "trickle": sorted(trickle), "flood": flood, "traffic": traffic,
            "shares": shares, "teams": teams, "slots": slots}


def test_a_saturated_deployment_serves_the_high_band_first_sheds_the_flood_and_shares_fairly(
        borrowed: Handle) -> None:
    handle = borrowed
    made: list[int] = []
    try:
        secrets: dict[str, str] = {}
        for team in ("gw-team-a", "gw-team-b"):
            response = handle.call("POST", "/api/v1/teams/", json={"name": team})
            assert response.status_code in (201, 400), response.text  # 400: made by an earlier run
        # Keys of teams without deployments of their own: the borrowed deployment stays open
        # (keyless) for the next borrower, and each key's team is its fairness flow.
        for name, team, priority in (("batch", "gw-team-a", "low"),
                                     ("interactive", "gw-team-a", "high"),
                                     ("team-a", "gw-team-a", "normal"),
                                     ("team-b", "gw-team-b", "normal")):
            created = expect_created(handle.call("POST", "/api/v1/keys/", json={
                "name": f"gw-{name}", "team": team, "all_deployments": True,
                "priority": priority}))
            made.append(created["id"])
            secrets[name] = created["key"]
        # The gateway hears of the keys within one sync round.
        wait_until(lambda: handle.served_model_name in _listed(handle, secrets["batch"]),
              "the gateway to know the keys", 30)

        result = asyncio.run(_saturate(handle, secrets))

        flood: Tally = result["flood"]
        trickle = result["trickle"]
        shares = result["shares"]
        teams = result["teams"]
        slo_s = TTFT_SLO_S
        # Printed before the assertions: a failing run shows what it measured.
        print(f"\ngateway saturation: idle TTFT {result['idle']}, high band under the flood "
              f"{[round(t, 3) for t in trickle]} (SLO {slo_s} s); flood {len(flood.ok)} served, "
              f"{flood.refused} refused; team shares {shares}, refused a "
              f"{teams['a'].refused} times, b {teams['b'].refused}; slots held by a and b "
              f"{[tuple(_held(r).values()) for r in result['slots']]}")
        # The flood was shed (429 with a Retry-After), and still served in part.
        assert flood.refused > 0 and flood.ok, (flood.refused, len(flood.ok))
        assert all(int(value) >= 1 for value in flood.retry_after)
        # Every high-priority request was served, its TTFT within the plan's SLO although 20
        # clients kept the deployment saturated.
        assert trickle[int(len(trickle) * 0.9) - 1] <= slo_s, (trickle, result["idle"], slo_s)
        # The console showed the queue while the flood ran: every slot taken, the flood waiting.
        rows = result["traffic"]
        assert rows and all(r["gateway"] == "running" and r["limit"] == 8 for r in rows), rows
        assert any(r["in_flight"] == 8 and {w["band"] for w in r["waiting"]} == {"low"}
                   for r in rows), rows
        # While both teams kept requests waiting, each held half of the slots, although team a
        # sends twice as much: 4 and 4 in 24 of 24 readings. With the queue's flows picked first
        # come first served instead, 11 of 24 (and 5/3 to 7/1 between). What the queue shares
        # out is slots; how many requests each team then gets answered in a window also follows
        # the engines, and is printed, not held: on two cores a team's requests admitted
        # together went through them together, and a group of four took 2.7 s at times where
        # most took 0.5 s (a log of every release in the gateway: 4 and 4 at 338 of 353). With
        # the fair order the teams were served 453/355 in one run, 245/160 in a CI run; first
        # come first served gave 451/447. The queue's exact order is held by
        # tests/unit/test_gateway_flow_control.py.
        both_waiting = [_held(r) for r in result["slots"]
                        if {w["flow"] for w in r["waiting"] if w["band"] == "normal"}
                        == {"gw-team-a", "gw-team-b"}]
        assert len(both_waiting) >= 5, result["slots"]
        halves = [held for held in both_waiting if set(held.values()) == {4}]
        assert len(halves) >= 0.75 * len(both_waiting), both_waiting
        assert all(shares.values()), shares
        # The team that sends twice as much is the one turned away.
        assert teams["a"].refused > 2 * teams["b"].refused, (teams["a"].refused,
                                                             teams["b"].refused)
    finally:
        for key_id in made:
            handle.call("POST", f"/api/v1/keys/{key_id}/revoke")
