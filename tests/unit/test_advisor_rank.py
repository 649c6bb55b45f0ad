"""inference/advisor: the candidates the devices allow, and a ranking that flips with the load.

One set of speeds (a server whose prefill of a long prompt triples the cost of the decode
steps it shares a step with) and two loads on two devices:
- short prompts only: both colocated servers decode (each half the load), while PD leaves one
  device to prefill short prompts and piles every stream on the other: colocated must win;
- long prompts next to a latency-sensitive chat stream, with a TPOT SLO the chat stream meets
  only when nothing prefills beside it: PD must win.
"""

from __future__ import annotations

import pytest

from inference.advisor.candidates import TIE_RTOL, candidates, rank
from inference.advisor.errors import InputError
from inference.advisor.goodput import Slo
from inference.advisor.load import profile_from_json
from inference.advisor.simulate import Topology
from inference.advisor.speeds import speeds_from_json

SEEDS = [0, 1, 2]
SPEEDS = speeds_from_json({
    "prefill_ms": {"tokens": [16, 4096], "ms": [10, 2000]},
    "decode_step_ms": {"batch": [1, 32], "ms": [20, 80]},
    "handoff_ms": {"tokens": [0, 4096], "ms": [5, 50]},
    "interference": {"tokens": [0, 2000], "factor": [1.0, 3.0]}})


def test_the_candidates_of_three_devices() -> None:
    assert candidates(3, devices_per_server=1) == [
        Topology(colocated=1), Topology(colocated=2), Topology(colocated=3),
        Topology(prefill=1, decode=1), Topology(prefill=1, decode=2), Topology(prefill=2, decode=1)]
    assert candidates(3, devices_per_server=2) == [Topology(colocated=1)]
    with pytest.raises(InputError, match="--devices: 1 devices cannot hold one server of 2"):
        candidates(1, devices_per_server=2)


def test_short_prompts_colocated_wins() -> None:
    profile = profile_from_json({"streams": [
        {"rate_per_s": 10, "requests": 200, "prompt_tokens": 32, "output_tokens": 32}]})
    ranked = rank(profile, SPEEDS, Slo(ttft_ms=200, tpot_ms=50), devices=2, seeds=SEEDS)
    best, runner_up = ranked[0], ranked[1]
    assert best.topology == Topology(colocated=2)
    assert best.best_in == len(SEEDS)
    assert best.summary.attained > 0.95
    assert runner_up.topology == Topology(prefill=1, decode=1)
    # The decode server of PD carries the whole load: its steps grow past the TPOT SLO.
    assert runner_up.summary.goodput_rps < 0.8 * best.summary.goodput_rps
    assert runner_up.summary.tpot_ms[0] > best.summary.tpot_ms[0]


def test_long_prompts_beside_a_chat_stream_pd_wins() -> None:
    profile = profile_from_json({"streams": [
        {"name": "chat", "rate_per_s": 4, "requests": 200, "prompt_tokens": 32, "output_tokens": 64},
        {"name": "documents", "rate_per_s": 0.3, "requests": 15, "prompt_tokens": 2000,
         "output_tokens": 4}]})
    ranked = rank(profile, SPEEDS, Slo(ttft_ms=1500, tpot_ms=60), devices=2, seeds=SEEDS)
    best, runner_up = ranked[0], ranked[1]
    assert best.topology == Topology(prefill=1, decode=1)
    assert best.best_in == len(SEEDS)
    assert runner_up.topology == Topology(colocated=2)
    assert runner_up.summary.goodput_rps < 0.8 * best.summary.goodput_rps
    # What PD removes: the long prefills' stalls in the chat stream's tokens.
    assert best.summary.itl_ms[-1] < runner_up.summary.itl_ms[-1] / 5


def test_the_ranking_is_the_same_for_the_same_seeds() -> None:
    profile = profile_from_json({"streams": [
        {"rate_per_s": 5, "requests": 40, "prompt_tokens": [20, 400, 900], "output_tokens": [4, 40]}]})
    first, again = (rank(profile, SPEEDS, Slo(500, 60), devices=3, seeds=SEEDS) for _ in range(2))
    assert first == again
    assert {r.topology for r in first} == set(candidates(3, 1))
    assert all(len(r.goodput_by_seed) == len(SEEDS) for r in first)


def test_a_tie_goes_to_fewer_servers() -> None:
    """A light load every candidate serves within the SLOs: their goodputs differ only by when
    the last answer lands, and the topology with the fewest servers is recommended even where
    a bigger one's goodput comes out a little higher."""
    profile = profile_from_json({"streams": [
        {"rate_per_s": 2, "requests": 60, "prompt_tokens": [32, 96], "output_tokens": [16, 64]}]})
    ranked = rank(profile, SPEEDS, Slo(ttft_ms=1000, tpot_ms=100), devices=2, seeds=SEEDS)
    assert all(r.summary.attained == 1.0 for r in ranked)
    assert ranked[0].topology == Topology(colocated=1)
    highest = max(r.summary.goodput_rps for r in ranked)
    assert highest > ranked[0].summary.goodput_rps  # the tie rule, not the goodput, picked it
    assert ranked[0].summary.goodput_rps >= highest * (1 - TIE_RTOL)
    assert [r.topology.servers for r in ranked] == sorted(r.topology.servers for r in ranked)

