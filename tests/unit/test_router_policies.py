"""Routing policies: each one's choice on its own (plain Backend objects with a given load), and
through the router against stub workers, where the decisions show up in the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from inference.router.backends import Backend, NoBackendAvailable, Pool
from inference.router.config import build_parser, config_from_args
from inference.router.policies import Choice, LeastOutstanding, PrefixAware, RoundRobin, make_policy
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]
DECISIONS = "pdserve_router_policy_decisions_total"


def backends(*loads: int) -> list[Backend]:
    return [Backend(url=f"http://10.0.0.{i}:8000", role="prefill", healthy=True, in_flight=load)
            for i, load in enumerate(loads)]


def names(members: list[Backend], picks: list[Backend]) -> list[int]:
    return [members.index(b) for b in picks]


# ---- each policy on its own -------------------------------------------------------------------

def test_round_robin_takes_each_in_turn_whatever_the_load() -> None:
    members = backends(9, 0, 4)
    policy = RoundRobin()
    picks = [policy.choose(members, []) for _ in range(6)]
    assert names(members, [c.backend for c in picks]) == [0, 1, 2, 0, 1, 2]
    assert {c.outcome for c in picks} == {"picked"}


def test_least_outstanding_takes_the_least_loaded() -> None:
    members = backends(3, 1, 2)
    assert LeastOutstanding().choose(members, []).backend is members[1]


def test_least_outstanding_breaks_ties_round_robin() -> None:
    members = backends(1, 0, 0)
    policy = LeastOutstanding()
    picks = [policy.choose(members, []).backend for _ in range(4)]
    assert names(members, picks) == [1, 2, 1, 2]


BLOCK = 4


def prompt(prefix: int, tail: int, length: int = 3 * BLOCK) -> list[int]:
    """`length` token ids whose first block is determined by `prefix`, the rest by `tail`."""
    return [prefix] * BLOCK + [tail] * (length - BLOCK)


def test_prefix_key_covers_exactly_the_first_n_blocks() -> None:
    policy = PrefixAware(block_size=BLOCK, blocks=2)
    base = list(range(100, 112))
    assert policy.prefix_key(base) == policy.prefix_key([*base[:8], 1, 2, 3, 4])
    assert policy.prefix_key(base) != policy.prefix_key([*base[:7], 1, *base[8:]])
    # Exactly N blocks: vLLM computes a prompt's last token itself, so at most N-1 of them
    # could come from the cache; such a prompt is "short".
    assert policy.prefix_key(base[:8]) is None
    assert policy.prefix_key(base[:9]) is not None


def test_prefix_aware_sends_a_shared_prefix_to_the_same_backend() -> None:
    members = backends(0, 0, 0)
    policy = PrefixAware(block_size=BLOCK, blocks=1)
    first = policy.choose(members, prompt(prefix=7, tail=1))
    assert first.outcome == "prefix_miss"
    home = first.backend
    # Load the home up to the bound: max(2, 2 x 0) in flight still counts as not overloaded.
    for load, tail in ((1, 2), (2, 3)):
        home.in_flight = load
        again = policy.choose(members, prompt(prefix=7, tail=tail))
        assert (again.backend, again.outcome) == (home, "prefix_hit")


def test_prefix_aware_spreads_new_prefixes_by_load() -> None:
    members = backends(2, 0, 1)
    policy = PrefixAware(block_size=BLOCK, blocks=1)
    first = policy.choose(members, prompt(prefix=1, tail=0))
    assert (first.backend, first.outcome) == (members[1], "prefix_miss")
    members[1].in_flight = 5
    second = policy.choose(members, prompt(prefix=2, tail=0))
    assert (second.backend, second.outcome) == (members[2], "prefix_miss")


@pytest.mark.parametrize(
    ("home_load", "other_load", "outcome"),
    [
        (2, 0, "prefix_hit"),            # bound max(2, 0) = 2
        (3, 0, "overloaded_fallback"),
        (4, 2, "prefix_hit"),            # bound max(2, 4) = 4
        (5, 2, "overloaded_fallback"),
    ],
)
def test_prefix_aware_falls_back_to_the_least_loaded_past_the_load_bound(
        home_load: int, other_load: int, outcome: str) -> None:
    members = backends(0, 0)
    policy = PrefixAware(block_size=BLOCK, blocks=1)
    home = policy.choose(members, prompt(prefix=3, tail=0)).backend
    other = members[1] if home is members[0] else members[0]
    home.in_flight, other.in_flight = home_load, other_load
    choice = policy.choose(members, prompt(prefix=3, tail=1))
    assert choice.outcome == outcome
    assert choice.backend is (home if outcome == "prefix_hit" else other)
    # The home stays: once the burst passes, its warm cache serves the prefix again.
    home.in_flight = other.in_flight = 0
    assert policy.choose(members, prompt(prefix=3, tail=2)) == Choice(home, "prefix_hit")


def test_prefix_aware_short_prompts_go_to_the_least_loaded() -> None:
    members = backends(1, 0)
    choice = PrefixAware(block_size=BLOCK, blocks=2).choose(members, prompt(prefix=1, tail=2, length=8))
    assert (choice.backend, choice.outcome) == (members[1], "short_prompt")


def test_prefix_aware_rehomes_a_prefix_whose_backend_is_gone() -> None:
    members = backends(0, 0)
    policy = PrefixAware(block_size=BLOCK, blocks=1)
    home = policy.choose(members, prompt(prefix=5, tail=0)).backend
    survivors = [b for b in members if b is not home]
    moved = policy.choose(survivors, prompt(prefix=5, tail=1))
    assert (moved.backend, moved.outcome) == (survivors[0], "prefix_miss")
    # The new home sticks, even once the old one is back.
    assert policy.choose(members, prompt(prefix=5, tail=2)).backend is survivors[0]


def test_prefix_aware_table_is_bounded_least_recently_used_first() -> None:
    members = backends(0, 0, 0)
    policy = PrefixAware(block_size=BLOCK, blocks=1, table_size=2)
    for prefix in (1, 2):
        policy.choose(members, prompt(prefix=prefix, tail=0))
    assert policy.choose(members, prompt(prefix=1, tail=1)).outcome == "prefix_hit"  # 1 now newest
    policy.choose(members, prompt(prefix=3, tail=0))  # evicts 2
    assert policy.choose(members, prompt(prefix=1, tail=2)).outcome == "prefix_hit"
    assert policy.choose(members, prompt(prefix=2, tail=1)).outcome == "prefix_miss"


def test_pool_offers_the_policy_only_ready_members_other_than_the_excluded() -> None:
    pool = Pool("prefill", ("http://a", "http://b", "http://c"), RoundRobin())
    a, b, c = pool.backends
    a.healthy, b.healthy, c.healthy = True, False, True
    picks = [pool.pick([], exclude=a).backend for _ in range(2)]
    assert picks == [c, c]
    c.healthy = False
    with pytest.raises(NoBackendAvailable, match="prefill"):
        pool.pick([], exclude=a)


def test_make_policy_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="fastest"):
        make_policy("fastest", prefix_block_size=16, prefix_blocks=1)


# ---- the CLI --------------------------------------------------------------------------------

CONSOLE_ARGV = ["--served-model-name", MODEL, "--tokenizer", "/m", "--max-model-len", "128",
                "--kv-channel", "shared-storage", "--host", "127.0.0.1", "--port", "9999",
                "--local-prefill-max-tokens", "128",
                "--prefill", "http://127.0.0.1:9101", "--decode", "http://127.0.0.1:9201"]


def test_the_console_argv_keeps_least_outstanding_for_both_roles() -> None:
    config = config_from_args(build_parser().parse_args(CONSOLE_ARGV))
    assert (config.prefill_policy, config.decode_policy) == ("least_outstanding", "least_outstanding")


def test_policies_are_chosen_per_role_on_the_command_line() -> None:
    args = build_parser().parse_args([*CONSOLE_ARGV, "--prefill-policy", "prefix_aware",
                                      "--decode-policy", "round_robin", "--prefix-block-size", "16",
                                      "--prefix-blocks", "4"])
    config = config_from_args(args)
    assert (config.prefill_policy, config.decode_policy) == ("prefix_aware", "round_robin")
    assert (config.prefix_block_size, config.prefix_blocks) == (16, 4)


@pytest.mark.parametrize(("argv", "flag"), [(["--prefix-blocks", "0"], "--prefix-blocks"),
                                            (["--prefix-block-size", "-1"], "--prefix-block-size")])
def test_bad_prefix_settings_are_refused(argv: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        config_from_args(build_parser().parse_args([*CONSOLE_ARGV, *argv]))


def test_an_unknown_policy_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*CONSOLE_ARGV, "--prefill-policy", "fastest"])
    assert "--prefill-policy" in capsys.readouterr().err


# ---- through the router -----------------------------------------------------------------------

def completion(token_ids: list[int], **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": token_ids, "max_tokens": 2, **extra}


async def test_prefix_aware_prefill_keeps_a_prefix_on_one_worker_and_counts_it(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefills = [await make_stub("prefill-a"), await make_stub("prefill-b")]
    decode = await make_stub("decode")
    running = await start_router(prefill=tuple(p.url for p in prefills), decode=(decode.url,),
                                 prefill_policy="prefix_aware", prefix_block_size=BLOCK,
                                 prefix_blocks=1)
    for tail in (1, 2, 3, 4):
        response = await running.client.post("/v1/completions", json=completion(prompt(7, tail)))
        assert response.status == 200, await response.text()
    other = await running.client.post("/v1/completions", json=completion(prompt(8, 1)))
    assert other.status == 200

    got = [[r.body["prompt"][0] for r in p.requests] for p in prefills]
    # Every prompt starting with block [7]*4 on one worker; the new prefix on the other.
    assert sorted(got) == [[7, 7, 7, 7], [8]]
    labels = {"role": "prefill", "policy": "prefix_aware"}
    assert await running.metric(DECISIONS, {**labels, "outcome": "prefix_miss"}) == 2
    assert await running.metric(DECISIONS, {**labels, "outcome": "prefix_hit"}) == 3
    assert await running.metric(DECISIONS, {"role": "decode", "policy": "least_outstanding",
                                            "outcome": "picked"}) == 5


async def test_prefix_aware_spills_over_when_the_home_is_overloaded(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    workers = [await make_stub("full-a"), await make_stub("full-b")]
    gate = asyncio.Event()
    for worker in workers:
        worker.stream_gate = gate  # each stream stays in flight after its first chunk
    running = await start_router(colocated=tuple(w.url for w in workers),
                                 colocated_policy="prefix_aware", prefix_block_size=BLOCK,
                                 prefix_blocks=1)
    streams = []
    for tail in range(4):
        response = await running.client.post(
            "/v1/completions", json=completion(prompt(9, tail), stream=True))
        assert response.status == 200
        await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=3)
        streams.append(response)

    # Three fit on the home (in flight 0, 1, 2 <= max(2, 2 x 0)); the fourth finds it at 3.
    counts = sorted(len(w.requests) for w in workers)
    assert counts == [1, 3]
    labels = {"role": "colocated", "policy": "prefix_aware"}
    assert await running.metric(DECISIONS, {**labels, "outcome": "overloaded_fallback"}) == 1
    assert await running.metric(DECISIONS, {**labels, "outcome": "prefix_hit"}) == 2
    gate.set()
    for response in streams:
        await response.read()
    pool = running.router.registry.primary.pools["colocated"]
    await wait_until(lambda: all(b.in_flight == 0 for b in pool.backends))


async def test_round_robin_decode_alternates_even_when_one_worker_is_busy(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill = await make_stub("prefill")
    decodes = [await make_stub("decode-a"), await make_stub("decode-b")]
    gate = asyncio.Event()
    decodes[0].stream_gate = gate
    running = await start_router(prefill=(prefill.url,), decode=tuple(d.url for d in decodes),
                                 decode_policy="round_robin")
    held = await running.client.post("/v1/completions",
                                     json=completion(prompt(1, 1), stream=True))
    await asyncio.wait_for(held.content.readuntil(b"\n\n"), timeout=3)
    # decode-a has a request in flight; least_outstanding would avoid it, round robin does not.
    for tail in (2, 3):
        response = await running.client.post("/v1/completions", json=completion(prompt(1, tail)))
        assert response.status == 200
    assert [len(d.requests) for d in decodes] == [2, 1]
    gate.set()
    await held.read()
