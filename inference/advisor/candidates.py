"""The topologies a number of devices allows, each simulated over several seeds and ranked.

Every server uses ``devices_per_server`` devices, the size the speeds were measured at (a
server on more devices is a different measurement, not an extrapolation). Candidates use up to
all the devices: colocated with N servers, and PD with every P:D split of up to N servers.

Confidence: each seed draws a new workload (new arrivals, the length samples resampled), and
every candidate is simulated on the same draws. Reported per candidate: goodput's range over
the seeds, and in how many seeds it was tied for the highest goodput (within ``TIE_RTOL``).
(A replayed trace with fixed lengths draws the same workload every time: its seeds agree and
say nothing more.)

Ties: goodput within ``TIE_RTOL`` of a better candidate's is a tie, and a tie goes to fewer
servers, then colocated before PD. When candidates both serve the whole load within the SLOs,
their goodputs differ only by when the run's last answer lands (a fraction of a percent), which
says nothing about which serves it better. What the model leaves out grows with the servers:
on a node of fixed size, each server more takes a core from its neighbours' API servers, the
router and the clients, which no measured step includes. (DistServe ranks placements by
goodput per GPU for the same reason: a device more must buy goodput.) Measured here
(README, "Is the advisor right here?"): two colocated servers on two cores, predicted 0.4 %
ahead of one, served 0.66 of one's goodput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inference.advisor.errors import InputError
from inference.advisor.goodput import Slo, Summary, summarize
from inference.advisor.load import LoadProfile
from inference.advisor.simulate import Outcome, Topology, simulate
from inference.advisor.speeds import Speeds

TIE_RTOL = 0.01


def candidates(devices: int, devices_per_server: int) -> list[Topology]:
    servers = devices // devices_per_server
    if servers < 1:
        raise InputError("--devices", f"{devices} devices cannot hold one server of "
                                      f"{devices_per_server} (devices_per_server in --speeds)")
    colocated = [Topology(colocated=n) for n in range(1, servers + 1)]
    disaggregated = [Topology(prefill=p, decode=total - p)
                     for total in range(2, servers + 1) for p in range(1, total)]
    return colocated + disaggregated


@dataclass(frozen=True)
class Ranked:
    topology: Topology
    summary: Summary  # over all seeds' requests pooled
    goodput_by_seed: tuple[float, ...]
    best_in: int  # seeds in which it was tied for the highest goodput (within TIE_RTOL)


def pooled(outcomes: Sequence[Outcome]) -> Outcome:
    return Outcome(*(np.concatenate([getattr(o, name) for o in outcomes])
                     for name in ("ttft_s", "tpot_s", "e2e_s", "itl_s")),
                   duration_s=sum(o.duration_s for o in outcomes))


def rank(profile: LoadProfile, speeds: Speeds, slo: Slo, devices: int,
         seeds: Sequence[int]) -> list[Ranked]:
    """Best first: highest goodput, ties (``TIE_RTOL``) to fewer servers, then colocated first."""
    topologies = candidates(devices, speeds.devices_per_server)
    workloads = [profile.draw(seed) for seed in seeds]
    outcomes = [[simulate(w, t, speeds) for w in workloads] for t in topologies]
    by_seed = np.array([[summarize(o, slo).goodput_rps for o in row] for row in outcomes])
    best = by_seed >= by_seed.max(axis=0) * (1 - TIE_RTOL)
    ranked = [Ranked(t, summarize(pooled(row), slo), tuple(float(g) for g in by_seed[i]),
                     int(best[i].sum()))
              for i, (t, row) in enumerate(zip(topologies, outcomes, strict=True))]
    return in_tiers(ranked)


def in_tiers(ranked: list[Ranked]) -> list[Ranked]:
    """The highest goodput left heads a tier of every candidate within ``TIE_RTOL`` of it;
    inside a tier, fewer servers first."""
    left = sorted(ranked, key=lambda r: -r.summary.goodput_rps)
    ordered: list[Ranked] = []
    while left:
        floor = left[0].summary.goodput_rps * (1 - TIE_RTOL)
        tier = [r for r in left if r.summary.goodput_rps >= floor]
        left = left[len(tier):]
        ordered += sorted(tier, key=lambda r: (r.topology.servers, r.topology.prefill,
                                               r.topology.label, -r.summary.goodput_rps))
    return ordered
