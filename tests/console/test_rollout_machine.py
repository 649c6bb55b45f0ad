"""Revisions, the rollout's stored state machine and its analysis, without workers: drafts are
checked as plans are, every transition is a history row and an audit entry, and an analysis
window with too few requests holds rather than passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from console.audit.models import AuditEntry
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.rollouts import analysis, revisions, services
from console.rollouts.machine import TransitionRefused, move
from console.rollouts.models import Revision, Rollout
from tests.console.tiny_models import make_plan, make_startable, register, running

REQUESTS = "pdserve_router_requests_total"


@pytest.fixture(name="running")
def running_plan(db: None, tmp_path: Path) -> Deployment:
    return running(make_startable(make_plan(tmp_path)))


def test_the_first_start_makes_revision_1_and_a_layout_edit_keeps_it(running: Deployment) -> None:
    first = revisions.ensure_live(running)
    assert (first.number, first.state) == (1, Revision.State.LIVE)
    # Cores are a live edit: the same revision, as laid out now.
    running.workers.filter(role="decode").update(cpu_cores="0")
    again = revisions.ensure_live(running)
    assert again.pk == first.pk
    assert again.spec["pools"]["decode"]["instances"][0]["cpu_cores"] == "0"
    assert AuditEntry.objects.filter(action="revision.create").count() == 1


def test_a_draft_changes_the_variant_and_lists_its_diff(running: Deployment,
                                                        tmp_path: Path) -> None:
    other = register(running.base_model, tmp_path, "other")
    draft, report = revisions.create_draft(running, {"sampling_defaults": {"temperature": 0.5}},
                                           {"decode": other}, None, note="try other")
    assert (draft.number, draft.state) == (2, Revision.State.DRAFT)
    live = revisions.live(running)
    assert live is not None and live.number == 1
    changes = revisions.diff(live.spec, draft.spec)
    assert changes == {"sampling_defaults": [{"temperature": 0}, {"temperature": 0.5}],
                       "variant.decode": ["tiny/bf16", "tiny/other"]}
    # Nothing of the plan changed.
    running.refresh_from_db()
    assert running.sampling_defaults == {"temperature": 0}
    assert report.ok, report.errors


def test_a_draft_that_changes_nothing_or_names_no_field_is_refused(running: Deployment) -> None:
    with pytest.raises(ValidationError) as same:
        revisions.create_draft(running, {}, {}, None)
    assert "nothing to roll out" in str(same.value)
    with pytest.raises(ValidationError) as unknown:
        revisions.create_draft(running, {"router_port": 1}, {}, None)
    assert "router_port" in unknown.value.message_dict
    with pytest.raises(ValidationError) as flags:
        revisions.create_draft(running, {"extra_engine_args": ["--port", "1"]}, {}, None)
    assert "extra_engine_args" in flags.value.message_dict
    assert running.revisions.count() == 1  # the live one only


def test_a_topology_switch_needs_the_new_roles_variant(running: Deployment) -> None:
    with pytest.raises(ValidationError) as missing:
        revisions.create_draft(running, {"mode": "colocated"}, {}, None)
    assert "colocated" in missing.value.message_dict
    variant = running.workers.first().variant
    draft, _ = revisions.create_draft(running, {"mode": "colocated"}, {"colocated": variant}, None)
    assert set(draft.spec["pools"]) == {"colocated"}


def _rollout(running: Deployment, tmp_path: Path, **options: object) -> Rollout:
    other = (Variant.objects.filter(base=running.base_model, name="green").first()
             or register(running.base_model, tmp_path, "green"))
    draft, _ = revisions.create_draft(running, {}, {"prefill": other, "decode": other}, None)
    return services.start(running, draft, "canary", None, **options)


def test_a_rollout_starts_with_ports_of_its_own_and_one_at_a_time(running: Deployment,
                                                                  tmp_path: Path) -> None:
    rollout = _rollout(running, tmp_path)
    assert rollout.state == Rollout.State.STARTING
    assert rollout.weights == {"1": 100, "2": 0}
    planned = {p for w in running.workers.all() for p in (w.port, w.side_channel_port)}
    green = {p for ports in rollout.green_ports.values() for p in ports.values()}
    assert len(green) == 4 and not green & planned
    assert [t.to_state for t in rollout.transitions.all()] == ["starting"]
    with pytest.raises(services.RolloutRefused, match="one rollout at a time"):
        services.start(running, rollout.to_revision, "canary", None)


def test_bad_steps_and_analysis_name_their_field(running: Deployment, tmp_path: Path) -> None:
    cases = [({"steps": [{"weight": 50}]}, "steps"),
             ({"steps": [{"weight": 60}, {"weight": 50}, {"weight": 100}]}, "steps.1.weight"),
             ({"steps": [{"weight": 0}, {"weight": 100}]}, "steps.0.weight"),
             ({"analysis": {"interval_s": 0}}, "analysis.interval_s"),
             ({"analysis": {"metrics": {"latency": {"max": 1}}}}, "analysis.metrics.latency"),
             ({"analysis": {"metrics": {"ttft_p95": {"max_ratio": -1}}}},
              "analysis.metrics.ttft_p95.max_ratio")]
    for options, field in cases:
        with pytest.raises(ValidationError) as refused:
            _rollout(running, tmp_path, **options)
        assert field in refused.value.message_dict, (options, refused.value)
        Revision.objects.filter(state=Revision.State.DRAFT).delete()
    assert not Rollout.objects.exists()


def test_every_transition_is_stored_and_audited_and_a_wrong_one_refused(
        running: Deployment, tmp_path: Path) -> None:
    rollout = _rollout(running, tmp_path)
    services.pause(rollout)
    assert rollout.state == Rollout.State.PAUSED and rollout.paused_from == "starting"
    services.resume(rollout)
    assert rollout.state == Rollout.State.STARTING
    with pytest.raises(TransitionRefused):
        services.promote(rollout)  # green has not passed its gate nor taken traffic
    with pytest.raises(TransitionRefused):
        move(rollout, Rollout.State.SUCCEEDED, "skipping ahead")
    services.rollback(rollout)
    assert rollout.weights == {"1": 100, "2": 0}
    states = [(t.from_state, t.to_state) for t in rollout.transitions.all()]
    assert states == [("starting", "starting"), ("starting", "paused"), ("paused", "starting"),
                      ("starting", "rolling_back")]
    actions = list(AuditEntry.objects.filter(action__startswith="rollout.")
                   .order_by("pk").values_list("action", flat=True))
    assert actions == ["rollout.starting", "rollout.paused", "rollout.starting",
                       "rollout.rolling_back"]


def _metrics(**by_revision: tuple[int, int, list[tuple[float, int]]]) -> str:
    """Router metrics text: per revision (requests, 5xx, TTFT buckets [(le, cumulative)])."""
    lines = [f"# TYPE {REQUESTS[:-6]} counter", "# TYPE pdserve_router_ttft_seconds histogram"]
    for revision, (ok, failed, buckets) in by_revision.items():
        lines.append(f'{REQUESTS}{{endpoint="completions",status="200",role="prefill+decode",'
                     f'revision="{revision}"}} {ok}')
        lines.append(f'{REQUESTS}{{endpoint="completions",status="503",role="none",'
                     f'revision="{revision}"}} {failed}')
        for le, count in buckets:
            bound = "+Inf" if le == float("inf") else repr(le)
            lines.append(f'pdserve_router_ttft_seconds_bucket{{revision="{revision}",'
                         f'le="{bound}"}} {count}')
    return "\n".join(lines) + "\n"


CONFIG = {"min_requests": 10, "metrics": {"error_rate": {"max": 0.05},
                                          "ttft_p95": {"max_ratio": 1.5}}}
INF = float("inf")


def test_analysis_passes_fails_and_holds_on_too_few_requests() -> None:
    empty = analysis.parse(_metrics(r1=(0, 0, [(0.1, 0), (1.0, 0), (INF, 0)]),
                                    r2=(0, 0, [(0.1, 0), (1.0, 0), (INF, 0)])))
    fine = analysis.parse(_metrics(r1=(100, 0, [(0.1, 90), (1.0, 100), (INF, 100)]),
                                   r2=(20, 0, [(0.1, 18), (1.0, 20), (INF, 20)])))
    judged = analysis.judge(empty, fine, "r1", "r2", CONFIG)
    assert judged.verdict == "pass", judged.metrics
    assert judged.requests == {"r1": 100.0, "r2": 20.0}
    slow = analysis.parse(_metrics(r1=(100, 0, [(0.1, 90), (1.0, 100), (INF, 100)]),
                                   r2=(20, 0, [(0.1, 2), (1.0, 20), (INF, 20)])))
    judged = analysis.judge(empty, slow, "r1", "r2", CONFIG)
    assert judged.verdict == "fail" and judged.metrics["ttft_p95"]["verdict"] == "fail"
    erring = analysis.parse(_metrics(r1=(100, 0, [(0.1, 90), (1.0, 100), (INF, 100)]),
                                     r2=(18, 2, [(0.1, 18), (1.0, 18), (INF, 18)])))
    judged = analysis.judge(empty, erring, "r1", "r2", CONFIG)
    assert judged.metrics["error_rate"] == {**judged.metrics["error_rate"], "verdict": "fail",
                                            "green": 0.1}
    few = analysis.parse(_metrics(r1=(100, 0, [(0.1, 90), (1.0, 100), (INF, 100)]),
                                  r2=(5, 0, [(0.1, 5), (1.0, 5), (INF, 5)])))
    assert analysis.judge(empty, few, "r1", "r2", CONFIG).verdict == "inconclusive"


def test_quantiles_follow_prometheus_histogram_quantile() -> None:
    assert analysis.histogram_quantile(0.5, [(1.0, 50), (2.0, 100), (INF, 100)]) == 1.0
    assert analysis.histogram_quantile(0.95, [(1.0, 50), (2.0, 100), (INF, 100)]) == pytest.approx(1.9)
    assert analysis.histogram_quantile(0.99, [(1.0, 50), (2.0, 98), (INF, 100)]) == 2.0
    assert analysis.histogram_quantile(0.5, [(1.0, 0), (INF, 0)]) is None
