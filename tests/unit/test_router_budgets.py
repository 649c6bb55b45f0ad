"""Per-model limits and token budgets at the router: a model's own limit refuses on that model
only (in memory and on the real Redis at 127.0.0.1:6379); a key's and a team's budget refuse with
429 ``budget_exceeded`` and Retry-After once the console's pushed spend plus this router's
unsynced tokens reach it, never count the same tokens twice, renew at the period's boundary
(UTC, an injected clock), and start from the ledger file after a restart."""

from __future__ import annotations

import calendar
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from inference.router.budgets import BudgetMeter, periods
from inference.router.errors import RequestError
from inference.router.keys import KeySet, key_hash, new_key, parse_key_set, public_prefix
from inference.router.ratelimit_stores import MemoryStore, RedisStore, Scope
from tests.unit.conftest import REDIS_URL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

ADMIN = "admin-token"
BODY = {"prompt": "hello world the quick brown fox", "max_tokens": 4}
REFUSALS = "pdserve_router_budget_refusals_total"
# 2026-12-31 23:59:00 UTC: a minute before both the day and the month renew.
NEW_YEAR_EVE = float(calendar.timegm((2026, 12, 31, 23, 59, 0)))
NEW_YEAR = float(calendar.timegm((2027, 1, 1, 0, 0, 1)))


@pytest.fixture
def key(fresh_key: str) -> str:
    return fresh_key


def entry(secret: str, key_id: int, **fields: Any) -> dict[str, Any]:
    return {"id": key_id, "prefix": public_prefix(secret), "hash": key_hash(secret), **fields}


def key_set(*entries: dict[str, Any], teams: dict[str, Any] | None = None,
            version: str = "1") -> dict[str, Any]:
    return {"version": version, "require_key": True, "keys": list(entries), "teams": teams or {}}


def write(tmp_path: Path, body: dict[str, Any]) -> str:
    path = tmp_path / f"keys-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(body))
    return str(path)


def budget(tokens: int, period: str = "month", spent: int = 0, spent_here: int = 0,
           now: float = NEW_YEAR_EVE) -> dict[str, Any]:
    day, month = periods(now)
    return {"tokens": tokens, "period": period, "spent": spent, "spent_here": spent_here,
            "period_start": (day if period == "day" else month).start}


async def start(start_router: StartRouter, worker: StubVLLM, tmp_path: Path,
                body: dict[str, Any], clock: list[float] | None = None,
                **settings: Any) -> RunningRouter:
    worker.with_usage = True  # the answers' usage says how many tokens each one cost
    running = await start_router(colocated=(worker.url,), keys_file=write(tmp_path, body),
                                 admin_token=ADMIN, **settings)
    if clock is not None:
        running.router.usage.clock = lambda: clock[0]
    return running


async def post(running: RunningRouter, secret: str) -> tuple[int, Any, dict[str, Any]]:
    response = await running.client.post("/v1/completions", json=BODY,
                                         headers={"Authorization": f"Bearer {secret}"})
    return response.status, response.headers, await response.json()


async def tokens_of_one(running: RunningRouter, secret: str) -> int:
    status, _, answer = await post(running, secret)
    assert status == 200, answer
    return int(answer["usage"]["total_tokens"])


def refused(status: int, headers: Any, answer: dict[str, Any]) -> dict[str, Any]:
    assert status == 429, answer
    assert int(headers["Retry-After"]) >= 1
    return dict(answer["error"])


# ---- per-model limits ---------------------------------------------------------------------
async def test_a_model_limit_refuses_on_that_model_only(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, redis_url: str | None,
        key: str) -> None:
    worker = await make_stub("w")
    body = key_set(entry(key, 1, limits={"requests_per_minute": 3},
                         model_limits={"big": {"requests_per_minute": 1}}))
    big = await start(start_router, worker, tmp_path, body, served_model_name="big",
                      redis_url=redis_url)
    small = await start(start_router, worker, tmp_path, body, served_model_name="small",
                        redis_url=redis_url)
    assert (await post(big, key))[0] == 200
    error = refused(*await post(big, key))
    assert error["code"] == "rate_limit_exceeded"
    assert error["param"] == "requests_per_minute"
    assert "on model 'big' (1)" in error["message"]
    # The key's own 3 a minute are untouched by what it did on "big" (on a shared Redis too).
    assert [(await post(small, key))[0] for _ in range(3)] == [200, 200, 200]
    error = refused(*await post(small, key))
    assert error["param"] == "requests_per_minute" and "model" not in error["message"]


async def test_limits_a_model_does_not_name_stay_the_keys(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, redis_url: str | None,
        key: str) -> None:
    worker = await make_stub("w")
    body = key_set(entry(key, 1, limits={"requests_per_minute": 2, "max_concurrency": 4},
                         model_limits={"big": {"max_concurrency": None}}))
    big = await start(start_router, worker, tmp_path, body, served_model_name="big",
                      redis_url=redis_url)
    [parsed] = big.router.gate.key_set.keys
    assert parsed.limits.max_concurrency is None and parsed.limits.requests_per_minute == 2
    assert [(await post(big, key))[0] for _ in range(2)] == [200, 200]
    assert refused(*await post(big, key))["param"] == "requests_per_minute"


def test_model_limits_are_checked_like_the_keys() -> None:
    secret = new_key()
    with pytest.raises(RequestError) as bad:
        parse_key_set(key_set(entry(secret, 1, model_limits={"big": {"rpm": 5}})))
    assert bad.value.param == "keys[0].model_limits.big.rpm"
    with pytest.raises(RequestError) as bad:
        parse_key_set(key_set(entry(secret, 1, model_limits={"big": {"max_concurrency": 0}})))
    assert bad.value.param == "keys[0].model_limits.big.max_concurrency"
    with pytest.raises(RequestError) as bad:
        parse_key_set(key_set(entry(secret, 1, budget={"tokens": 5, "period": "week"})))
    assert bad.value.param == "keys[0].budget.period"


# ---- token budgets ------------------------------------------------------------------------
async def test_a_key_budget_refuses_once_pushed_spend_plus_local_tokens_reach_it(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, key: str) -> None:
    worker = await make_stub("w")
    clock = [NEW_YEAR_EVE]
    probe = await start(start_router, worker, tmp_path, key_set(entry(key, 9)), clock)
    each = await tokens_of_one(probe, key)
    # Spent elsewhere: all but two requests' worth; this router's own count does the rest.
    running = await start(start_router, worker, tmp_path, key_set(
        entry(key, 1, budget=budget(100 * each, spent=98 * each))), clock)
    assert [(await post(running, key))[0] for _ in range(2)] == [200, 200]
    sent = len(worker.requests)
    status, headers, answer = await post(running, key)
    error = refused(status, headers, answer)
    assert error["code"] == "budget_exceeded" and error["param"] == "key_budget"
    assert error["message"] == (f"the key's monthly token budget of {100 * each} tokens is "
                                "spent; it renews at 2027-01-01T00:00:00Z")
    assert headers["Retry-After"] == "60"
    assert await running.metric(REFUSALS, {"scope": "key", "period": "month"}) == 1
    assert len(worker.requests) == sent  # refused before any worker was asked


async def test_a_push_counts_the_routers_own_tokens_once(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, key: str) -> None:
    worker = await make_stub("w")
    clock = [NEW_YEAR_EVE]
    running = await start(start_router, worker, tmp_path, key_set(entry(key, 1)), clock)
    each = await tokens_of_one(running, key)
    own = each + await tokens_of_one(running, key)
    admin = {"Authorization": f"Bearer {ADMIN}"}

    async def push(spent: int, spent_here: int, version: str) -> None:
        body = key_set(entry(key, 1, budget=budget(own + each, spent=spent,
                                                   spent_here=spent_here)), version=version)
        assert (await running.client.put("/admin/keys", json=body, headers=admin)).status == 200

    # The console has read this router's two requests: spent includes them, spent_here says so.
    await push(own, own, "2")
    assert (await post(running, key))[0] == 200  # own + each: now spent
    assert refused(*await post(running, key))["code"] == "budget_exceeded"
    # A push from before the console read them (a key edit): the router's own count still holds.
    await push(0, 0, "3")
    assert refused(*await post(running, key))["code"] == "budget_exceeded"
    listed = await (await running.client.get("/admin/keys", headers=admin)).json()
    assert listed["keys"][0]["spent"] == {"key": own + each}


async def test_a_team_budget_spans_the_teams_keys(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("w")
    clock = [NEW_YEAR_EVE]
    first, second, other = new_key(), new_key(), new_key()
    probe = await start(start_router, worker, tmp_path, key_set(entry(first, 9)), clock)
    each = await tokens_of_one(probe, first)
    body = key_set(entry(first, 1, team=7), entry(second, 2, team=7), entry(other, 3, team=8),
                   teams={"7": budget(4 * each, period="day", spent=each, spent_here=0)})
    running = await start(start_router, worker, tmp_path, body, clock)
    assert (await post(running, first))[0] == 200
    assert (await post(running, second))[0] == 200
    assert (await post(running, first))[0] == 200
    for secret in (first, second):
        error = refused(*await post(running, secret))
        assert error["param"] == "team_budget"
        assert error["message"].startswith(f"the team's daily token budget of {4 * each} tokens")
    assert (await post(running, other))[0] == 200  # another team's key
    assert await running.metric(REFUSALS, {"scope": "team", "period": "day"}) == 2


async def test_a_budget_renews_at_the_period_boundary(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, key: str) -> None:
    worker = await make_stub("w")
    clock = [NEW_YEAR_EVE]
    running = await start(start_router, worker, tmp_path, key_set(
        entry(key, 1, budget=budget(10, spent=10))), clock)
    status, headers, _ = await post(running, key)
    assert status == 429 and headers["Retry-After"] == "60"
    clock[0] = NEW_YEAR
    # The pushed spend is December's: January starts from what this router counts, nothing yet.
    assert (await post(running, key))[0] == 200


async def test_a_restarted_router_starts_from_its_ledger(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, key: str) -> None:
    worker = await make_stub("w")
    ledger = str(tmp_path / "usage" / "ledger.sqlite3")
    first = await start(start_router, worker, tmp_path, key_set(entry(key, 1)), usage_file=ledger)
    each = await tokens_of_one(first, key)
    await first.router.usage.flush()
    # No push from the console has counted that request yet (spent 0): the file says it.
    body = key_set(entry(key, 1, budget=budget(each, now=first.router.usage.clock())))
    second = await start(start_router, worker, tmp_path, body, usage_file=ledger)
    assert refused(*await post(second, key))["code"] == "budget_exceeded"


def test_the_meter_follows_the_utc_day_and_month() -> None:
    now = [NEW_YEAR_EVE - 86400]  # 30 December
    meter = BudgetMeter(clock=lambda: now[0])
    secret = new_key()
    day_budget = budget(10, period="day", now=now[0])
    month_budget = budget(15, period="month", now=now[0])
    keys: KeySet = parse_key_set(key_set(entry(secret, 1, team=2, budget=day_budget),
                                         teams={"2": month_budget}))
    meter.keys_changed(keys)
    [api_key] = keys.keys
    meter.record(api_key, 9)
    meter.check(api_key)
    meter.record(api_key, 1)
    with pytest.raises(Exception, match="key's daily token budget of 10"):
        meter.check(api_key)
    now[0] = NEW_YEAR_EVE  # the next day: the day's budget renews, the month's goes on
    meter.record(api_key, 5)
    with pytest.raises(Exception, match="team's monthly token budget of 15") as spent:
        meter.check(api_key)
    assert spent.value.retry_after_s == 60  # type: ignore[attr-defined]


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
async def test_a_models_lease_and_reservation_are_given_back_where_they_were_taken(
        store_kind: str, key: str) -> None:
    """The stores themselves: a model's concurrency and generated tokens count apart from the
    key's, and settling gives back to the model's counters."""
    store = MemoryStore() if store_kind == "memory" else RedisStore(REDIS_URL)
    prefix = public_prefix(key)
    assert prefix is not None
    on_big = Scope("big", (False, False, True, True))
    none = ((0, 0), (0, 0), (0, 0))
    try:
        assert (await store.admit(prefix, none, 1, "a", 30, on_big))[0] == 0
        assert (await store.admit(prefix, none, 1, "b", 30, on_big))[0] == 4
        # The key's own concurrency is another count.
        assert (await store.admit(prefix, none, 1, "c", 30))[0] == 0
        await store.settle(prefix, "a", 0, (0, 0), on_big)
        assert (await store.admit(prefix, none, 1, "b", 30, on_big))[0] == 0

        tokens = ((0, 0), (0, 0), (10, 10))
        refused, window = await store.admit(prefix, tokens, 0, "", 30, on_big)
        assert refused == 0
        assert (await store.admit(prefix, tokens, 0, "", 30, on_big))[0] == 3
        assert (await store.admit(prefix, tokens, 0, "", 30))[0] == 0  # the key's own minute
        await store.settle(prefix, None, window, (0, -10), on_big)  # nothing was generated
        assert (await store.admit(prefix, tokens, 0, "", 30, on_big))[0] == 0
    finally:
        if isinstance(store, RedisStore):
            await store.close()
