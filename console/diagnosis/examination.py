"""The eight symptoms evaluated together on one set of observations: a pure function, so that a
test can hand it observations and the view, the API and ``manage.py doctor`` all say the same."""

from __future__ import annotations

from collections.abc import Callable

from console.alerts import symptom_links as ids
from console.diagnosis import (
    divergence,
    kv_transfer,
    latency,
    memory_at_start,
    reachability,
    restarts,
)
from console.diagnosis.observations import Observations
from console.diagnosis.symptoms import ORDER, Diagnosis, State

RULES: dict[str, Callable[[Observations], Diagnosis]] = {
    ids.BACKEND_UNREACHABLE: reachability.diagnose,
    ids.KV_TRANSFER_TIMEOUT: kv_transfer.diagnose,
    ids.OOM_AT_START: memory_at_start.diagnose,
    ids.OUTPUT_DIFFERS: divergence.diagnose,
    ids.QUEUEING: latency.queueing,
    ids.TTFT_HIGH: latency.ttft,
    ids.STALLS: latency.stalls,
    ids.RESTARTS: restarts.diagnose,
}


def examine(obs: Observations) -> list[Diagnosis]:
    return [RULES[symptom](obs) for symptom in ORDER]


def worst(diagnoses: list[Diagnosis]) -> State:
    states = {d.state for d in diagnoses}
    for state in (State.PRESENT, State.SUSPECTED):
        if state in states:
            return state
    return State.NOT_SEEN
