"""The P:D ratio band from the topology advisor: the autoscaler keeps prefill instances per
decode instance within the ratios of the P:D splits the advisor predicts within ``WITHIN`` of
the best split's goodput, for a load. A band rather than the one best ratio: the prediction's
ranking between near-equal splits is within its error, and the autoscaler needs room to move."""

from __future__ import annotations

from typing import Any

from console.advisor.forms import LoadForm
from console.advisor.services import advice_for
from console.autoscaling.models import RatioBand
from console.autoscaling.services import save_band
from console.deployments.models import Deployment

WITHIN = 0.95


class BandRefused(Exception):
    """No band can be drawn from the advice; ``field`` names what is missing."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def ratios_of(advice: dict[str, Any]) -> tuple[float, float, list[str]]:
    """The band's (min, max) ratio and the splits it spans, best first."""
    if advice["status"] != "advised":
        raise BandRefused("advice", advice.get("detail") or f"no advice ({advice['status']})")
    splits = [c for c in advice["candidates"] if c["mode"] == "pd"]
    if not splits:
        raise BandRefused("advice", f"the node's {advice.get('devices')} devices allow no P:D "
                                    "split")
    best = max(c["goodput_rps"] for c in splits)
    if best <= 0:
        raise BandRefused("advice", "no P:D split meets the SLOs under this load: there is no "
                                    "ratio to keep")
    near = sorted((c for c in splits if c["goodput_rps"] >= WITHIN * best),
                  key=lambda c: -c["goodput_rps"])
    ratios = [c["servers"]["prefill"] / c["servers"]["decode"] for c in near]
    return min(ratios), max(ratios), [c["topology"] for c in near]


def band_from_advice(deployment: Deployment, form: LoadForm) -> tuple[RatioBand, list[str]]:
    """Set the deployment's ratio band from the advice for ``form``'s load (audited as any
    band change). Raises BandRefused, or the advice's LoadUnavailable."""
    low, high, splits = ratios_of(advice_for(deployment, form))
    return save_band(deployment, round(low, 4), round(high, 4)), splits
