"""inference/advisor's simulator against cases computed by hand.

The speeds: prefill 1 ms a prompt token (only the step's total counts), decode steps of 20 ms
for one request and 30 ms for two, a 10 ms KV hand-off; times below in seconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inference.advisor.load import Workload
from inference.advisor.simulate import Topology, simulate
from inference.advisor.speeds import Speeds, speeds_from_json

COLOCATED = Topology(colocated=1)
PD = Topology(prefill=1, decode=1)


def speeds(**extra: Any) -> Speeds:
    return speeds_from_json({"prefill_ms": {"tokens": [0, 1000], "ms": [0, 1000]},
                             "decode_step_ms": {"batch": [1, 2], "ms": [20, 30]},
                             "handoff_ms": {"tokens": [0, 1000], "ms": [10, 10]}, **extra})


def load(*requests: tuple[float, int, int]) -> Workload:
    """(arrival s, prompt tokens, output tokens) per request."""
    arrival, prompt, output = (np.array(column) for column in zip(*requests, strict=True))
    return Workload(arrival.astype(float), prompt, output)


def test_one_request_alone_colocated() -> None:
    result = simulate(load((0.0, 100, 5)), COLOCATED, speeds())
    # Prefill 100 ms gives the first token; four decode steps of 20 ms give the rest.
    assert result.ttft_s == pytest.approx([0.1])
    assert result.e2e_s == pytest.approx([0.18])
    assert result.tpot_s == pytest.approx([0.02])
    assert result.itl_s == pytest.approx([0.02] * 4)
    assert result.duration_s == pytest.approx(0.18)


def test_one_request_alone_disaggregated() -> None:
    result = simulate(load((0.0, 100, 5)), PD, speeds())
    # Prefill 100 ms, hand-off 10 ms, then decode's first step (20 ms) emits the first token:
    # the router streams decode's tokens, prefill's one token is discarded.
    assert result.ttft_s == pytest.approx([0.13])
    assert result.e2e_s == pytest.approx([0.21])
    assert result.tpot_s == pytest.approx([0.02])


def test_two_requests_arriving_together_share_steps() -> None:
    result = simulate(load((0.0, 100, 3), (0.0, 300, 3)), COLOCATED, speeds())
    # One step prefills both (400 tokens, 400 ms); then two decode steps of a batch of two.
    assert result.ttft_s == pytest.approx([0.4, 0.4])
    assert result.e2e_s == pytest.approx([0.46, 0.46])
    assert result.tpot_s == pytest.approx([0.03, 0.03])


def test_a_prompt_arriving_mid_step_waits_and_its_prefill_stalls_the_running_decode() -> None:
    mixed = speeds(interference={"tokens": [0], "factor": [1.5]})
    result = simulate(load((0.0, 100, 3), (0.05, 200, 2)), COLOCATED, mixed)
    # A: prefilled 0-0.1 (first token). B arrived at 0.05 and waits for that step to end.
    # Step 0.1-0.43 mixes A's decode and B's prefill: (200 + 20) ms * 1.5 = 330 ms; A's second
    # token and B's first. Step 0.43-0.46 decodes both (30 ms): A's third, B's second.
    assert result.ttft_s == pytest.approx([0.1, 0.38])
    assert result.e2e_s == pytest.approx([0.46, 0.41])
    assert result.tpot_s == pytest.approx([0.18, 0.03])
    assert sorted(result.itl_s) == pytest.approx([0.03, 0.03, 0.33])


def test_without_chunked_prefill_a_prompt_waits_for_room_in_the_budget() -> None:
    tight = speeds(batching={"max_num_batched_tokens": 300, "chunked_prefill": False})
    result = simulate(load((0.0, 100, 3), (0.0, 300, 1)), COLOCATED, tight)
    # B (300) does not fit beside A (100), nor beside A's decode token: it waits until A is
    # done at 0.14 (prefill 0.1, two steps of 20 ms), then takes 300 ms alone.
    assert result.ttft_s == pytest.approx([0.1, 0.44])
    assert result.e2e_s == pytest.approx([0.14, 0.44])
    assert np.isnan(result.tpot_s[1])  # one token: no TPOT


def test_chunked_prefill_splits_a_long_prompt_over_steps() -> None:
    tight = speeds(batching={"max_num_batched_tokens": 300})
    result = simulate(load((0.0, 700, 1)), COLOCATED, tight)
    # Chunks of 300, 300 and 100 tokens: 0.3 + 0.3 + 0.1 s.
    assert result.ttft_s == pytest.approx([0.7])


def test_a_prefill_queue_under_disaggregation() -> None:
    tight = speeds(batching={"max_num_batched_tokens": 150})
    result = simulate(load((0.0, 100, 2), (0.0, 100, 2)), PD, tight)
    # Prefill (no chunking on PD's prefill servers) takes A 0-0.1, then B 0.1-0.2 (it does not
    # fit beside A). A lands on decode at 0.11: tokens at 0.13 and 0.15. B lands at 0.21:
    # 0.23 and 0.25.
    assert result.ttft_s == pytest.approx([0.13, 0.23])
    assert result.e2e_s == pytest.approx([0.15, 0.25])


def test_requests_spread_over_colocated_servers() -> None:
    result = simulate(load((0.0, 100, 3), (0.0, 300, 3)), Topology(colocated=2), speeds())
    # One request per server, each alone: prefill then two 20 ms steps.
    assert result.ttft_s == pytest.approx([0.1, 0.3])
    assert result.tpot_s == pytest.approx([0.02, 0.02])


def test_a_step_beside_another_servers_step_costs_the_neighbour_factor() -> None:
    slowed = speeds(neighbour={"factor": 1.5})
    both = simulate(load((0.0, 100, 3), (0.0, 100, 3)), Topology(colocated=2), slowed)
    # Each server's prefill (100 ms) and two decode steps (20 ms) all run beside the other's.
    assert both.ttft_s == pytest.approx([0.15, 0.15])
    assert both.tpot_s == pytest.approx([0.03, 0.03])
    # Apart in time, neither is slowed: the second arrives after the first has finished.
    apart = simulate(load((0.0, 100, 3), (1.0, 100, 3)), Topology(colocated=2), slowed)
    assert apart.ttft_s == pytest.approx([0.1, 0.1])
    assert apart.tpot_s == pytest.approx([0.02, 0.02])
    # One server has no neighbour.
    alone = simulate(load((0.0, 100, 3)), COLOCATED, slowed)
    assert alone.ttft_s == pytest.approx([0.1])


def test_an_idle_prefill_server_does_not_slow_decode() -> None:
    # PD: prefill (100 ms) runs while decode is idle, then decode's steps run while prefill
    # idles: nothing is slowed. A second prompt prefilled during the first's decode steps is.
    result = simulate(load((0.0, 100, 3)), PD, speeds(neighbour={"factor": 1.5}))
    assert result.ttft_s == pytest.approx([0.13])
    assert result.e2e_s == pytest.approx([0.17])
    busy = simulate(load((0.0, 100, 5), (0.11, 100, 2)), PD, speeds(neighbour={"factor": 1.5}))
    # The second prompt's prefill starts at 0.11 s beside decode's idle moment: decode's first
    # step starts at 0.11 s too, after the prefill's step began, so it is slowed (30 ms).
    assert busy.ttft_s[0] == pytest.approx(0.14)


def test_the_same_workload_gives_the_same_result() -> None:
    work = load(*[(i * 0.05, 50 + 37 * i % 300, 1 + i % 9) for i in range(40)])
    first, second = (simulate(work, PD, speeds()) for _ in range(2))
    assert np.array_equal(first.ttft_s, second.ttft_s)
    assert np.array_equal(first.itl_s, second.itl_s)


@pytest.mark.parametrize("counts", [{}, {"colocated": 1, "prefill": 1}, {"prefill": 1},
                                    {"colocated": -1}, {"prefill": 2, "decode": -1}])
def test_a_topology_is_colocated_or_has_both_roles(counts: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="either colocated servers, or prefill and decode"):
        Topology(**counts)
