"""The supervisor's rollout runner over stored state alone: each step reads the rollout's row and
the process table and does what the state asks, so a new supervisor goes on where the last one
stopped. No router runs here (the runner then has nothing to drain); the live rollout test
(tests/e2e/test_rollouts_live.py) runs it against real workers and a real router."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from console.audit.models import AuditEntry
from console.catalog.models import Variant
from console.control.rollout_runner import RolloutRunner
from console.control.worker_specs import green_specs, kv_storage_path, process_specs
from console.deployments import engine_args
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.rollouts import revisions, services
from console.rollouts.machine import TransitionRefused
from console.rollouts.models import Revision, Rollout
from console.supervisor.models import ManagedProcess
from console.verification.models import VerificationReport
from console.verification.services import options as verification_options
from console.verification.subject import subject_of
from tests.console.sockets import free_port
from tests.console.tiny_models import make_plan, make_startable, register, running

State = Rollout.State
READY = ManagedProcess.State.READY


@pytest.fixture
def rollout(db: None, tmp_path: Path) -> Rollout:
    deployment = _ready(make_startable(make_plan(tmp_path)))
    green = register(deployment.base_model, tmp_path, "green")
    draft, _ = revisions.create_draft(deployment, {"gate_mode": "off"},
                                      {"prefill": green, "decode": green}, None)
    return services.start(deployment, draft, "canary", None,
                          steps=[{"weight": 10, "hold_s": 0}, {"weight": 100, "hold_s": 0}],
                          scale_down_delay_s=0)


def _green_ready(rollout: Rollout) -> None:
    for spec in green_specs(rollout.deployment, rollout):
        ManagedProcess.objects.create(deployment=rollout.deployment, slot=spec.slot,
                                      role=spec.role, port=spec.port, state=READY,
                                      log_path="/dev/null")


def _step(rollout: Rollout) -> Rollout:
    RolloutRunner().step({})  # a new runner each time: nothing is kept between supervisors
    rollout.refresh_from_db()
    return rollout


def test_green_runs_beside_blue_on_its_own_slots_ports_and_kv_directory(rollout: Rollout) -> None:
    deployment = rollout.deployment
    specs = green_specs(deployment, rollout)
    assert sorted(s.slot for s in specs) == ["decode-0@r2", "prefill-0@r2"]
    blue = {s.port for s in process_specs(deployment)}
    assert not {s.port for s in specs} & blue
    green_argv = " ".join(specs[0].argv)
    assert str(kv_storage_path(deployment, 2)) in green_argv
    assert str(kv_storage_path(deployment, 1)) not in green_argv
    assert "/green" in green_argv  # the revision's variant
    router = next(s for s in process_specs(deployment) if s.slot == "router")
    assert router.argv[router.argv.index("--revision") + 1] == "1"


def test_a_new_runner_takes_a_stored_rollout_to_the_end_and_the_plan_becomes_green(
        rollout: Rollout) -> None:
    assert _step(rollout).state == State.STARTING  # green not ready yet
    _green_ready(rollout)
    rollout = _step(rollout)
    assert (rollout.state, rollout.weights) == (State.STEPPING, {"1": 90, "2": 10})
    # Step 1 of 2 is held until an analysis window passes: none can without a router.
    assert _step(rollout).state == State.STEPPING
    services.promote(rollout)
    rollout = _step(rollout)  # the promoted step's weights
    rollout = _step(rollout)  # 100%: warm
    assert (rollout.state, rollout.weights) == (State.WARM, {"1": 0, "2": 100})
    rollout = _step(rollout)
    assert rollout.state == State.DRAINING
    green_ports = {slot: ports["port"] for slot, ports in rollout.green_ports.items()}
    # A window still open from the last analysis (stored as the runner stores one).
    rollout.progress = {**rollout.progress, "window": {"opened": "2026-12-04T09:00:00+00:00",
                                                       "requests": {"1": 3, "2": 4}}}
    Rollout.objects.filter(pk=rollout.pk).update(progress=rollout.progress)
    Deployment.objects.filter(pk=rollout.deployment_id).update(verify_after_start=True)
    rollout = _step(rollout)
    assert rollout.state == State.SUCCEEDED
    # Green is verified once it is ready, as after a start (tests/console/test_verify_after_ready.py).
    report = VerificationReport.objects.get(deployment_id=rollout.deployment_id)
    assert (report.trigger, report.state) == ("promotion", VerificationReport.State.WAITING)
    # Ended: no window shown as still collecting on its page.
    assert Rollout.objects.get(pk=rollout.pk).progress.get("window") is None
    deployment = Deployment.objects.get(pk=rollout.deployment_id)
    assert {w.slot: w.port for w in deployment.workers.all()} == green_ports
    assert {w.variant.name for w in deployment.workers.all()} == {"green"}
    # The slots swapped: green's processes are the plan's now, blue's are r1's (to stop).
    slots = dict(ManagedProcess.objects.filter(deployment=deployment).values_list("slot", "port"))
    assert set(slots) == {"prefill-0", "decode-0", "prefill-0@r1-retired",
                          "decode-0@r1-retired"}
    assert (slots["prefill-0"], slots["decode-0"]) == (green_ports["prefill-0"],
                                                       green_ports["decode-0"])
    assert not {slots["prefill-0@r1-retired"], slots["decode-0@r1-retired"]} & set(
        green_ports.values())
    assert dict(deployment.revisions.values_list("number", "state")) == {
        1: Revision.State.RETIRED, 2: Revision.State.LIVE}
    states = list(rollout.transitions.values_list("to_state", flat=True))
    assert states == ["starting", "stepping", "stepping", "stepping", "warm", "draining",
                      "succeeded"]
    # The next start of the same plan is the same revision.
    assert revisions.ensure_live(deployment).number == 2


def test_the_promotion_imports_vllm_s_parser_before_it_takes_the_database(
        db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Green changes an engine flag, so the promotion's plan save checks it with vLLM's own
    parser: its first build in a process (the import of vLLM, minutes on a saturated host) is
    made before the promotion's write transaction. Under load it was made inside: SQLite's
    write lock was held through it, and every other writer, a GET's token note included,
    failed "database is locked"."""
    deployment = _ready(make_startable(make_plan(tmp_path)))
    draft, _ = revisions.create_draft(
        deployment, {"gate_mode": "off", "extra_engine_args": ["--max-num-seqs", "64"]}, {},
        None)
    rollout = services.start(deployment, draft, "canary", None,
                             steps=[{"weight": 100, "hold_s": 0}], scale_down_delay_s=0)
    early: list[object] = []  # the import beside green's start, asked for, not made here
    monkeypatch.setattr(engine_args, "load_parser_in_background", early.append)
    _green_ready(rollout)
    while rollout.state != State.DRAINING:
        assert rollout.state not in Rollout.DONE_STATES, rollout.reason
        rollout = _step(rollout)
    assert early == [["--max-num-seqs", "64"]]
    # A supervisor started since (or whose early import has not ended): no parser built yet.
    built = engine_args.serve_parser
    built.cache_clear()
    depths: list[int] = []

    def serve_parser() -> Any:
        if built.cache_info().currsize == 0:
            depths.append(len(connection.atomic_blocks))
        return built()

    monkeypatch.setattr(engine_args, "serve_parser", serve_parser)
    outside = len(connection.atomic_blocks)  # the test's own transaction
    assert _step(rollout).state == State.SUCCEEDED
    assert Deployment.objects.get(pk=deployment.pk).extra_engine_args == ["--max-num-seqs", "64"]
    assert depths == [outside], f"built at transaction depth {depths}, outside is {outside}"


def test_a_rollouts_start_checks_green_outside_its_write_transaction(
        db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`manage.py rollout start` under `vllm bench serve` on `make up`: the start imported vLLM
    to check green's flags inside its (IMMEDIATE) transaction, held SQLite's write lock past
    the 20 s busy timeout, and the supervisor's tick died with "database is locked"."""
    deployment = _ready(make_startable(make_plan(tmp_path)))
    draft, _ = revisions.create_draft(
        deployment, {"gate_mode": "off", "extra_engine_args": ["--max-num-seqs", "64"]}, {},
        None)
    built = engine_args.serve_parser
    built.cache_clear()
    depths: dict[str, list[int]] = {"parser": [], "checks": []}

    def serve_parser() -> Any:
        if built.cache_info().currsize == 0:
            depths["parser"].append(len(connection.atomic_blocks))
        return built()

    check_spec = revisions.check_spec

    def checked(*args: Any, **kwargs: Any) -> Any:
        depths["checks"].append(len(connection.atomic_blocks))
        return check_spec(*args, **kwargs)

    monkeypatch.setattr(engine_args, "serve_parser", serve_parser)
    monkeypatch.setattr(revisions, "check_spec", checked)
    outside = len(connection.atomic_blocks)  # the test's own transaction
    rollout = services.start(deployment, draft, "blue_green", None)
    assert rollout.state == State.STARTING
    assert depths == {"parser": [outside], "checks": [outside]}, (depths, outside)


def test_a_rollback_asked_for_right_after_a_promotion_starts_green_of_its_own(
        rollout: Rollout) -> None:
    """Blue's workers still stopping when a one-click rollback to their revision comes: the
    rollback's green is new workers on its own ports, not the stopping ones (in a CI run, r1's
    stopping blue was taken for the rollback's green, ready at once on its old ports: the
    router was sent ports nothing listened on, and the old workers were never stopped)."""
    _green_ready(rollout)
    assert _step(rollout).state == State.STEPPING
    services.promote(rollout)  # no router here: no analysis window can pass
    for _ in range(4):  # the promoted step, warm, draining, succeeded
        rollout = _step(rollout)
    assert rollout.state == State.SUCCEEDED
    # Blue's workers have not stopped yet: still ready, under their retired slots.
    retired = ManagedProcess.objects.filter(deployment=rollout.deployment,
                                            slot__contains="@r1")
    assert set(retired.values_list("state", flat=True)) == {READY}
    back = services.rollback_to_previous(rollout.deployment, None)
    assert back.to_revision.number == 1
    specs = green_specs(rollout.deployment, back)
    assert sorted(s.slot for s in specs) == ["decode-0@r1", "prefill-0@r1"]
    assert not {s.port for s in specs} & set(retired.values_list("port", flat=True))
    assert _step(back).state == State.STARTING  # nothing of green's runs yet


def test_stopped_rows_of_an_earlier_life_of_the_green_revision_do_not_hold_it_back(
        rollout: Rollout) -> None:
    """A stopped row of an earlier life of the green revision, named like its green slots (an
    instance the autoscaler had added), does not hold green back. A live rollback once waited
    600 s on one of them."""
    ManagedProcess.objects.create(deployment=rollout.deployment, slot="decode-1@r2",
                                  role="decode", port=free_port(),
                                  state=ManagedProcess.State.STOPPED, log_path="/dev/null")
    _green_ready(rollout)
    assert _step(rollout).state == State.STEPPING


def test_a_green_that_does_not_start_in_time_is_rolled_back(rollout: Rollout) -> None:
    Rollout.objects.filter(pk=rollout.pk).update(
        state_since=timezone.now() - timedelta(seconds=rollout.start_timeout_s + 1))
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert "did not become ready" in rollout.reason
    rollout = _step(rollout)
    assert rollout.state == State.ROLLED_BACK
    assert rollout.to_revision.state == Revision.State.FAILED
    # Blue stays the plan; green's workers leave the reconcile.
    assert revisions.live(rollout.deployment).number == 1
    assert RolloutRunner().specs(rollout.deployment) == []


def test_a_revision_that_wants_the_gate_goes_through_it_first(rollout: Rollout,
                                                              tmp_path: Path) -> None:
    services.rollback(rollout)
    _step(rollout)
    green = Variant.objects.get(name="green")
    draft, _ = revisions.create_draft(rollout.deployment, {"gate_mode": "on"},
                                      {"prefill": green, "decode": green}, None)
    gated = services.start(rollout.deployment, draft, "canary", None)
    _green_ready(gated)
    runner = RolloutRunner()
    runner.stopping.set()  # the gate's thread ends at once, as in a stopping supervisor
    runner.step({})
    gated.refresh_from_db()
    assert gated.state == State.GATING
    assert gated.weights == {"1": 100, str(draft.number): 0}


@pytest.fixture
def two_pairs(db: None, tmp_path: Path) -> Deployment:
    """A running 2-prefill/2-decode plan with its processes ready and a live revision."""
    deployment = make_startable(make_plan(tmp_path, "tiny-2p2d"))
    variant = deployment.workers.first().variant
    for role in ("prefill", "decode"):
        first = deployment.workers.get(role=role)
        deployment.workers.create(role=role, index=1, variant=variant, node=first.node,
                                  port=free_port(), side_channel_port=free_port(),
                                  cpu_cores=first.cpu_cores, share_devices=True)
        deployment.workers.filter(role=role).update(share_devices=True)
    return _ready(deployment)


def _ready(deployment: Deployment) -> Deployment:
    """Running with a live revision, every planned worker's process ready."""
    deployment = running(deployment)
    revisions.ensure_live(deployment)
    for worker in deployment.workers.all():
        ManagedProcess.objects.create(deployment=deployment, slot=worker.slot, role=worker.role,
                                      port=worker.port, state=READY, log_path="/dev/null")
    return deployment


def _draft(deployment: Deployment, tmp_path: Path) -> Revision:
    green = register(deployment.base_model, tmp_path, "green")
    draft, _ = revisions.create_draft(deployment, {"gate_mode": "off"},
                                      {"prefill": green, "decode": green}, None)
    return draft


def _set(deployment: Deployment, slots: list[str], state: str) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot__in=slots).update(state=state)


def _passed(rollout: Rollout) -> None:
    """An analysis window that passed, as the runner stores one with a router to read."""
    rollout.analyses.create(step_index=rollout.step_index, window_s=10, verdict="pass")


def test_no_room_for_a_second_copy_proposes_in_place_which_replaces_pair_by_pair(
        two_pairs: Deployment, tmp_path: Path) -> None:
    draft = _draft(two_pairs, tmp_path)
    node = two_pairs.workers.first().node
    Node.objects.filter(pk=node.pk).update(memory_bytes=12 * 2**30)  # 4 workers fit, 8 do not
    with pytest.raises(services.RolloutRefused, match="in_place") as refused:
        services.start(two_pairs, draft, "canary", None)
    assert refused.value.field == "strategy"
    rollout = services.start(two_pairs, draft, "in_place", None,
                             steps=[{"hold_s": 0}, {"hold_s": 0}])
    assert rollout.steps == [{"weight": 50, "hold_s": 0}, {"weight": 100, "hold_s": 0}]
    blue_ports = {w.slot: w.port for w in two_pairs.workers.all()}
    assert {slot: p["port"] for slot, p in rollout.green_ports.items()} == blue_ports
    runner = RolloutRunner()

    # Pair 1: blue's drains and stops, then green's starts on its ports.
    rollout = _step(rollout)
    assert rollout.units == {"transit": 0} and rollout.weights == {"1": 100, "2": 0}
    assert runner.held_back(two_pairs) == {"prefill-0", "decode-0"}
    assert runner.specs(two_pairs) == []  # green's pair waits for blue's to stop
    assert _step(rollout).state == State.RELEASING
    _set(two_pairs, ["prefill-0", "decode-0"], ManagedProcess.State.STOPPED)
    rollout = _step(rollout)
    assert (rollout.state, rollout.units) == (State.STARTING, {"green": [0], "transit": None})
    specs = runner.specs(two_pairs)
    assert {s.slot: s.port for s in specs} == {"prefill-0@r2": blue_ports["prefill-0"],
                                               "decode-0@r2": blue_ports["decode-0"]}
    _green_ready(rollout)
    rollout = _step(rollout)
    assert (rollout.state, rollout.weights) == (State.STEPPING, {"1": 50, "2": 50})

    # Pair 2, once pair 1's analysis passed.
    _passed(rollout)
    rollout = _step(rollout)
    assert (rollout.state, rollout.step_index) == (State.RELEASING, 1)
    rollout = _step(rollout)
    assert rollout.weights == {"1": 0, "2": 100}  # pair 1 serves alone meanwhile
    _set(two_pairs, ["prefill-1", "decode-1"], ManagedProcess.State.STOPPED)
    rollout = _step(rollout)
    assert rollout.units["green"] == [0, 1]
    ManagedProcess.objects.filter(deployment=two_pairs, slot__endswith="@r2").update(state=READY)
    rollout = _step(rollout)
    assert (rollout.state, rollout.weights) == (State.STEPPING, {"1": 0, "2": 100})
    rollout = _step(rollout)
    assert rollout.state == State.DRAINING
    rollout = _step(rollout)
    assert rollout.state == State.SUCCEEDED
    deployment = Deployment.objects.get(pk=two_pairs.pk)
    assert {w.slot: w.port for w in deployment.workers.all()} == blue_ports  # the same ports
    assert {w.variant.name for w in deployment.workers.all()} == {"green"}
    assert runner.held_back(deployment) == frozenset()
    assert ManagedProcess.objects.get(deployment=deployment, slot="prefill-1").state == READY


def test_in_place_rolls_back_pair_by_pair_and_needs_two_pairs(two_pairs: Deployment,
                                                               tmp_path: Path) -> None:
    draft = _draft(two_pairs, tmp_path)
    rollout = services.start(two_pairs, draft, "in_place", None)
    rollout = _step(rollout)
    _set(two_pairs, ["prefill-0", "decode-0"], ManagedProcess.State.STOPPED)
    rollout = _step(rollout)
    _green_ready(rollout)
    ManagedProcess.objects.filter(deployment=two_pairs, slot__endswith="@r2").exclude(
        slot__in=["prefill-0@r2", "decode-0@r2"]).delete()
    rollout = _step(rollout)
    assert rollout.state == State.STEPPING
    with pytest.raises(TransitionRefused):
        services.promote(rollout)
    services.rollback(rollout)
    assert rollout.weights == {"1": 50, "2": 50}  # green keeps its share until handed back
    runner = RolloutRunner()
    rollout = _step(rollout)
    assert rollout.units == {"green": [], "transit": 0}
    assert rollout.weights == {"1": 100, "2": 0}
    assert runner.specs(two_pairs) == []  # green's pair stops...
    assert runner.held_back(two_pairs) == {"prefill-0", "decode-0"}  # ...before blue's starts
    _set(two_pairs, ["prefill-0@r2", "decode-0@r2"], ManagedProcess.State.STOPPED)
    assert runner.held_back(two_pairs) == frozenset()
    assert _step(rollout).state == State.ROLLING_BACK  # blue's pair is not serving yet
    _set(two_pairs, ["prefill-0", "decode-0"], READY)
    rollout = _step(rollout)
    assert rollout.units == {"green": [], "transit": None}
    rollout = _step(rollout)
    assert rollout.state == State.ROLLED_BACK
    assert revisions.live(two_pairs).number == 1

    one_pair = running(make_startable(make_plan(tmp_path, "tiny-1p1d-b")))
    green = Variant.objects.get(name="green")
    single, _ = revisions.create_draft(one_pair, {}, {"prefill": green, "decode": green}, None)
    with pytest.raises(services.RolloutRefused, match="at least two whole pairs"):
        services.start(one_pair, single, "in_place", None)


@pytest.fixture
def verified(rollout: Rollout) -> Rollout:
    """A blue-green rollout of the same green that asks for green's verification."""
    services.rollback(rollout)
    _step(rollout)
    return services.start(rollout.deployment, rollout.to_revision, "blue_green", None,
                          scale_down_delay_s=0, verify_green=True)


def _to_warm(rollout: Rollout) -> Rollout:
    _step(rollout)
    _green_ready(rollout)
    rollout = _step(rollout)
    services.promote(rollout)  # no router here, so no window could pass
    rollout = _step(_step(rollout))  # the promoted step's weights, then warm
    assert (rollout.state, rollout.weights) == (State.WARM, {"1": 0, "2": 100})
    return rollout


def _finish(report: VerificationReport, verdict: str, failing: str = "") -> None:
    sections = [{"name": name, "verdict": "fail" if name == failing else "pass"}
                for name in ("connectivity", "function", "stress")]
    VerificationReport.objects.filter(pk=report.pk).update(
        state=VerificationReport.State.DONE, verdict=verdict, sections=sections,
        finished_at=timezone.now())


def test_blue_is_drained_only_after_greens_own_report_passed(
        verified: Rollout, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    sent: list[int] = []
    monkeypatch.setattr("console.verification.services.run_verification.delay", sent.append)
    rollout = _to_warm(verified)
    # Another report of the deployment runs: green's waits for it, and blue stays.
    other = VerificationReport.objects.create(deployment=rollout.deployment, trigger="demand",
                                              state=VerificationReport.State.RUNNING,
                                              budget_s=300)
    rollout = _step(rollout)
    assert (rollout.state, rollout.verification) == (State.WARM, None)
    _finish(other, "pass")

    with django_capture_on_commit_callbacks(execute=True):
        rollout = _step(rollout)
    report = rollout.verification
    assert rollout.state == State.WARM and report is not None and sent == [report.pk]
    assert (report.trigger, report.revision, report.state) == ("green", 2, "queued")
    assert rollout.progress["verification"] == {"report": report.pk, "state": "queued",
                                                "verdict": ""}
    # What that report runs against: green's workers on their rollout ports, not the plan's.
    subject = subject_of(rollout.deployment, green=2)
    assert {w.slot: w.port for w in subject.workers} == {
        f"{slot}@r2": ports["port"] for slot, ports in rollout.green_ports.items()}
    assert {w.slot for w in subject_of(rollout.deployment).workers} == {"prefill-0", "decode-0"}
    # Shared storage: no side channel to check.
    assert "green_side_channels" not in report.options and subject.side_channels == ()

    assert _step(rollout).state == State.WARM  # still running
    _finish(report, "warn")  # warnings pass
    rollout = _step(rollout)
    assert rollout.state == State.DRAINING
    assert rollout.progress["verification"] == {"report": report.pk, "state": "done",
                                                "verdict": "warn"}
    assert AuditEntry.objects.filter(action="verification.run", object_id=str(report.pk)).exists()


def test_a_green_whose_own_report_fails_is_rolled_back_even_when_promoted(
        verified: Rollout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("console.verification.services.run_verification.delay", lambda _: None)
    rollout = _step(_to_warm(verified))
    assert rollout.verification is not None
    _finish(rollout.verification, "fail", failing="stress")
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert rollout.weights == {"1": 100, "2": 0}
    assert rollout.reason == (f"green r2's verification #{rollout.verification.pk} did not "
                              "pass (failing sections: stress)")


def test_greens_report_checks_greens_own_nixl_side_channels(
        verified: Rollout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("console.verification.services.run_verification.delay", lambda _: None)
    green = verified.to_revision
    Revision.objects.filter(pk=green.pk).update(spec={**green.spec, "kv_channel": "nixl"})
    rollout = _step(_to_warm(verified))
    report = rollout.verification
    assert report is not None
    chosen = {slot: ports["side_channel_port"] for slot, ports in rollout.green_ports.items()}
    assert report.options["green_side_channels"] == chosen
    assert report.options["lengths"] == verification_options()["lengths"]  # the default sweep
    subject = subject_of(rollout.deployment, 2, report.options["green_side_channels"])
    assert {(slot, port) for slot, _, port in subject.side_channels} == {
        (f"{slot}@r2", port) for slot, port in chosen.items()}
    # None of them is blue's: the plan's side channels are another report's.
    blue = {w.side_channel_port for w in rollout.deployment.workers.all()}
    assert not set(chosen.values()) & blue


def test_in_place_cannot_verify_green_alone(two_pairs: Deployment, tmp_path: Path) -> None:
    with pytest.raises(services.RolloutRefused) as refused:
        services.start(two_pairs, _draft(two_pairs, tmp_path), "in_place", None,
                       verify_green=True)
    assert refused.value.field == "verify_green"
