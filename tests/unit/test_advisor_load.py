"""inference/advisor: load profiles, the workloads drawn from them, and the recorded load."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from inference.advisor.errors import InputError
from inference.advisor.load import profile_from_json
from inference.advisor.recorded import profile_from_timelines, timeline_records


def test_poisson_arrivals_start_at_zero_and_keep_the_rate() -> None:
    profile = profile_from_json({"streams": [
        {"rate_per_s": 4.0, "requests": 4000, "prompt_tokens": 64, "output_tokens": [8, 16]}]})
    work = profile.draw(seed=3)
    assert len(work) == 4000 and work.arrival_s[0] == 0.0
    assert np.all(np.diff(work.arrival_s) >= 0)
    assert (len(work) - 1) / work.arrival_s[-1] == pytest.approx(4.0, rel=0.05)
    assert set(work.prompt_tokens) == {64}
    assert set(work.output_tokens) == {8, 16}


def test_the_same_seed_draws_the_same_workload_and_another_seed_another() -> None:
    profile = profile_from_json({"streams": [
        {"rate_per_s": 2.0, "requests": 50, "prompt_tokens": [10, 20, 30], "output_tokens": 5}]})
    first, again, other = profile.draw(7), profile.draw(7), profile.draw(8)
    assert np.array_equal(first.arrival_s, again.arrival_s)
    assert np.array_equal(first.prompt_tokens, again.prompt_tokens)
    assert not np.array_equal(first.arrival_s, other.arrival_s)


def test_streams_merge_in_arrival_order_from_the_first_arrival() -> None:
    profile = profile_from_json({"streams": [
        {"arrivals_s": [10.0, 12.0], "prompt_tokens": 1000, "output_tokens": 4},
        {"arrivals_s": [11.0], "prompt_tokens": 50, "output_tokens": 100}]})
    work = profile.draw(0)
    assert list(work.arrival_s) == [0.0, 1.0, 2.0]
    assert list(work.prompt_tokens) == [1000, 50, 1000]
    assert list(work.output_tokens) == [4, 100, 4]


@pytest.mark.parametrize(("profile", "where"), [
    ({}, "streams: expected a non-empty list"),
    ({"streams": [{"rate_per_s": 1, "requests": 5, "output_tokens": 4}]},
     "streams[0].prompt_tokens: missing"),
    ({"streams": [{"rate_per_s": 1, "prompt_tokens": 5, "output_tokens": 4}]},
     "streams[0].requests: missing"),
    ({"streams": [{"prompt_tokens": 5, "output_tokens": 4}]}, "streams[0]: give either rate_per_s"),
    ({"streams": [{"rate_per_s": 0, "requests": 5, "prompt_tokens": 5, "output_tokens": 4}]},
     "streams[0].rate_per_s: must be above 0"),
    ({"streams": [{"arrivals_s": [0], "requests": 3, "prompt_tokens": 5, "output_tokens": 4}]},
     "streams[0].requests: only with rate_per_s"),
    ({"streams": [{"arrivals_s": [0], "prompt_tokens": [5, 0], "output_tokens": 4}]},
     "streams[0].prompt_tokens[1]: must be at least 1"),
    ({"streams": [{"arrivals_s": [0], "prompt_tokens": 5, "output_tokens": 4, "rate": 2}]},
     "streams[0].rate: unknown field"),
])
def test_a_bad_profile_names_the_field(profile: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as raised:
        profile_from_json(profile)
    assert str(raised.value).startswith(where)


def timeline(start: float, prompt: int | None, output: int | None, status: int = 200) -> str:
    record = {"request_id": "r", "endpoint": "chat", "start": start, "events_ms": {},
              "prompt_tokens": prompt, "completion_tokens": output, "status": status}
    return f"2026-12-04 21:00:00 INFO pdserve.router.timeline timeline {json.dumps(record)}"


def test_the_recorded_load_has_the_timelines_rate_and_lengths() -> None:
    lines = ["router listening on :8080", timeline(1000.0, 100, 20), timeline(1001.0, 300, 40),
             timeline(1003.0, 200, 30), timeline(1003.5, 50, None, status=400),
             timeline(1004.0, 120, 25)]
    recorded = profile_from_timelines(timeline_records(lines, "--timelines"), "--timelines")
    assert (recorded.used, recorded.skipped) == (4, 1)
    (stream,) = recorded.profile.streams
    assert stream.rate_per_s == pytest.approx(3 / 4.0)  # four arrivals, three gaps, 4 s
    assert stream.requests == 4
    assert sorted(stream.prompt_tokens.samples) == [100, 120, 200, 300]
    assert sorted(stream.output_tokens.samples) == [20, 25, 30, 40]


def test_too_few_timelines_for_a_rate_is_an_error() -> None:
    with pytest.raises(InputError, match="1 usable request timelines"):
        profile_from_timelines(timeline_records([timeline(1.0, 10, 10)], "--timelines"),
                               "--timelines")
    with pytest.raises(InputError, match="line 2: a timeline that is not JSON"):
        timeline_records(["x", "timeline {broken"], "--timelines")
