"""One histogram, one quantile: the rollout analysis, the alert evaluation (over the router's
snapshot) and the console's re-export read the same router /metrics text the same way, the way
Prometheus' histogram_quantile reads it (inference/prom_text.py)."""

from __future__ import annotations

import math

import pytest
from django.utils import timezone

from console.alerts import rule_states
from console.alerts import series as catalog
from console.alerts.models import Scope
from console.alerts.snapshots import frame, grouped
from console.deployments.models import Deployment
from console.live import metrics_export
from console.live.models import ProcessScrape
from console.rollouts import analysis
from console.supervisor.models import ManagedProcess
from inference import prom_snapshot, prom_text

REVISION = "r1"
# The router's TTFT twice: the analysis compares revisions on pdserve_router_ttft_seconds, the
# dashboard and the ttft_slo alert read pdserve_router_first_byte_seconds; here they hold the
# same observations, so every reader must answer the same.
NAMES = ("pdserve_router_ttft_seconds", "pdserve_router_first_byte_seconds")


def router_text(buckets: list[tuple[str, float]]) -> str:
    lines = []
    for name in NAMES:
        lines += [f"# HELP {name} h", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{le}",revision="{REVISION}"}} {count}'
                  for le, count in buckets]
    return "\n".join(lines) + "\n"


BEFORE = [("0.05", 10.0), ("0.1", 20.0), ("0.5", 30.0), ("+Inf", 30.0)]
CASES = {
    # Interpolated inside a finite bucket: p95 of 100 new observations, 30 of them in (0.1, 0.5].
    "inside a bucket": (BEFORE, [("0.05", 40.0), ("0.1", 90.0), ("0.5", 130.0), ("+Inf", 130.0)]),
    # The rank lies in the +Inf bucket: the second-highest bound, 0.5, never an extrapolation.
    "in the +Inf bucket": (BEFORE, [("0.05", 20.0), ("0.1", 30.0), ("0.5", 40.0), ("+Inf", 70.0)]),
    # Interpolated from 0 in the lowest bucket.
    "in the lowest bucket": (BEFORE, [("0.05", 110.0), ("0.1", 120.0), ("0.5", 130.0),
                                      ("+Inf", 130.0)]),
    # The router restarted between the readings: its buckets count from zero.
    "after a reset": (BEFORE, [("0.05", 1.0), ("0.1", 2.0), ("0.5", 4.0), ("+Inf", 4.0)]),
    # Nothing observed in the window: no quantile (Prometheus' NaN).
    "no observations": (BEFORE, BEFORE),
    # Only the +Inf bucket (Prometheus: NaN); the analysis used to answer 0.
    "only +Inf": ([("+Inf", 1.0)], [("+Inf", 5.0)]),
    # No +Inf bucket (Prometheus: NaN); the analysis used to answer from the finite buckets.
    "no +Inf": ([("0.1", 1.0), ("0.5", 2.0)], [("0.1", 5.0), ("0.5", 9.0)]),
}
WANT = {"inside a bucket": 0.1 + 0.4 * (25 / 30), "in the +Inf bucket": 0.5,
        "in the lowest bucket": 0.05 * (95 / 100), "after a reset": 0.1 + 0.4 * (1.8 / 2),
        "no observations": None, "only +Inf": None, "no +Inf": None}


def _alert_value(stats: dict, at: float) -> float | None:
    """The ttft_slo rule's value, ``last(router.ttft_p95[60s])``, as the evaluator folds it."""
    definition = catalog.get("router.ttft_p95")
    snapshot = frame(at, {"router": {"role": "router", "up": 1, **stats}}, {}, set(), {}, None)
    points = grouped(definition, catalog.instance_points(definition, [snapshot]), Scope.DEPLOYMENT)
    if not points:
        return None
    return rule_states.aggregate(points[("", "")], "last", 60.0, at)


@pytest.mark.parametrize("case", CASES)
def test_analysis_alerts_and_snapshot_agree(case: str) -> None:
    before, after = (router_text(rows) for rows in CASES[case])
    want = WANT[case]

    window = analysis.window(analysis.parse(before), analysis.parse(after), REVISION,
                             quantile=0.95)
    stats = prom_snapshot.router_stats(prom_snapshot.parse(before, 0.0),
                                       prom_snapshot.parse(after, 1.0))
    alert = _alert_value(stats, 1.0)
    readings = {"analysis": window["ttft_p95"], "snapshot": stats["ttft_p95"], "alert": alert}
    if want is None:
        assert readings == {"analysis": None, "snapshot": None, "alert": None}
    else:
        # The snapshot keeps 6 digits.
        assert readings == {key: pytest.approx(want, abs=1e-6) for key in readings}


@pytest.mark.parametrize("case", ["inside a bucket", "in the +Inf bucket", "after a reset"])
def test_the_re_export_keeps_the_buckets(case: str, deployment: Deployment) -> None:
    """What a Prometheus scraping the console gets holds the router's buckets unchanged, so its
    histogram_quantile answers as the console does."""
    before, after = CASES[case]
    router = ManagedProcess.objects.create(
        deployment=deployment, slot="router", role="router", port=8080,
        state=ManagedProcess.State.READY, log_path="/nonexistent.log")
    ProcessScrape.objects.create(process=router, scraped=timezone.now(), text=router_text(after))
    body = metrics_export.render(timezone.now()).decode()
    read = prom_text.samples(body).get("pdserve_router_first_byte_seconds_bucket", [])
    assert all(labels["deployment"] == deployment.name and labels["process"] == "router"
               for labels, _ in read)
    (rows,) = prom_text.histograms(read).values()
    assert rows == sorted((float(le), count) for le, count in after)
    exported = prom_text.histogram_quantile(
        0.95, prom_text.increase([(float(le), count) for le, count in before], rows))
    assert exported == pytest.approx(WANT[case])
    assert not math.isnan(exported)
