"""inference/advisor: which requests count towards goodput, and the percentiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inference.advisor.goodput import Slo, summarize
from inference.advisor.simulate import Outcome

NAN = math.nan


def outcome(ttft: list[float], tpot: list[float], duration: float) -> Outcome:
    ttft_s = np.array(ttft)
    return Outcome(ttft_s, np.array(tpot), ttft_s + 1.0, np.array([0.01, 0.02]), duration)


def test_goodput_counts_requests_meeting_both_slos_over_the_duration() -> None:
    result = summarize(outcome(
        ttft=[0.1, 0.6, 0.2, 0.5, 0.3],
        # meets; TTFT too late; one-token answer (meets any TPOT); TTFT exactly at the SLO
        # (meets); TPOT too slow.
        tpot=[0.05, 0.05, NAN, 0.1, 0.2], duration=2.0), Slo(ttft_ms=500, tpot_ms=100))
    assert result.goodput_rps == pytest.approx(3 / 2.0)
    assert result.attained == pytest.approx(3 / 5)
    assert result.requests == 5


def test_percentiles_are_numpys_linear_ones_in_ms_without_the_undefined_tpots() -> None:
    result = summarize(outcome(ttft=[0.1, 0.2, 0.3, 0.4, 0.5], tpot=[0.01, 0.03, NAN, NAN, NAN],
                               duration=1.0), Slo(1000, 1000))
    assert result.ttft_ms == pytest.approx((300, 460, 496))
    assert result.tpot_ms == pytest.approx((20, 28, 29.8))
    assert result.itl_ms == pytest.approx((15, 19, 19.9))
