"""Issue 25: a start deadline that follows green's progress, analysis windows that grow at low
traffic and pause (never hold forever) past their bound, and the ready-made alert rules after
a rollout switches topology. The runner runs on stored state; the router is replaced at its
edge (its /metrics text, its admin API), everything else is real."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from console.accounts.models import Membership, Role, Team
from console.alerts.models import AlertRule
from console.asgi import application
from console.control.rollout_runner import RolloutRunner
from console.control.worker_specs import green_specs
from console.deployments.models import Deployment
from console.live import start_phase
from console.live.models import LogLine, MetricSample
from console.rollouts import analysis, green_progress, revisions, services
from console.rollouts.models import AnalysisRun, Revision, Rollout
from console.supervisor.models import ManagedProcess
from tests.console.team_users import token_client
from tests.console.tiny_models import make_plan, make_startable, register, running

State = Rollout.State
READY, STARTING = ManagedProcess.State.READY, ManagedProcess.State.STARTING


def _ready(deployment: Deployment) -> Deployment:
    deployment = running(deployment)
    revisions.ensure_live(deployment)
    for worker in deployment.workers.all():
        ManagedProcess.objects.create(deployment=deployment, slot=worker.slot, role=worker.role,
                                      port=worker.port, state=READY, log_path="/dev/null")
    return deployment


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    return _ready(make_startable(make_plan(tmp_path)))


@pytest.fixture
def draft(plan: Deployment, tmp_path: Path) -> Revision:
    green = register(plan.base_model, tmp_path, "green")
    made, _ = revisions.create_draft(plan, {"gate_mode": "off"},
                                     {"prefill": green, "decode": green}, None)
    return made


def _step(rollout: Rollout, runner: RolloutRunner | None = None) -> Rollout:
    (runner or RolloutRunner()).step({})
    rollout.refresh_from_db()
    return rollout


def _age(rollout: Rollout, seconds: float) -> None:
    Rollout.objects.filter(pk=rollout.pk).update(
        state_since=timezone.now() - timedelta(seconds=seconds))
    rollout.refresh_from_db()


def _green_processes(rollout: Rollout, state: str = STARTING,
                     started_ago_s: float = 0) -> list[ManagedProcess]:
    started = timezone.now() - timedelta(seconds=started_ago_s)
    return [ManagedProcess.objects.create(
        deployment=rollout.deployment, slot=spec.slot, role=spec.role, port=spec.port,
        state=state, log_path="/dev/null", started_at=started)
        for spec in green_specs(rollout.deployment, rollout)]


def _log(process: ManagedProcess, text: str, ago_s: float) -> None:
    seq = LogLine.objects.filter(process=process).count() + 1
    LogLine.objects.create(process=process, seq=seq, text=text,
                           created=timezone.now() - timedelta(seconds=ago_s))


# ---- the start deadline ------------------------------------------------------------------

def test_vllm_log_lines_name_the_phase_of_a_start() -> None:
    lines = {
        "=== pdserve 2026-12-04T05:16:01+00:00 starting decode-0: python -m vllm": "starting",
        "(Worker pid=1) INFO [cpu_model_runner.py:68] Starting to load model /m...": "loading weights",
        "Loading safetensors checkpoint shards:  0% Completed | 0/1": "loading weights",
        "(Worker pid=1) INFO [cpu_model_runner.py:87] Warming up model for the compilation...":
            "compiling",
        "INFO Compiling model again due to a load failure from /c/torch_aot_compile/x": "compiling",
        "(Worker pid=1) INFO [cpu_model_runner.py:91] Warming up done.": "warming up",
        "(EngineCore pid=2) INFO [core.py:402] init engine (profile, create kv cache, warmup "
        "model) took 132.07 s": "warming up",
        "(APIServer pid=3) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:8200":
            "warming up",
        "(APIServer pid=3) INFO [model.py:733] Resolved architecture: LlamaForCausalLM": None,
    }
    assert {text: start_phase.phase_of(text) for text in lines} == lines


def test_a_green_worker_that_still_progresses_is_not_timed_out(plan: Deployment,
                                                               draft: Revision) -> None:
    """The user's green compiled for 7 minutes past a 600 s deadline that counted from the
    start: a deadline that counts from the last progress lets it finish."""
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=120)
    _age(rollout, 900)  # far past the deadline since the start
    prefill, decode = _green_processes(rollout, started_ago_s=900)
    for process in (prefill, decode):
        _log(process, "=== pdserve 2026-12-04T05:16:01+00:00 starting x: vllm", 900)
        _log(process, "INFO Warming up model for the compilation...", 300)
        _log(process, "INFO No available shared memory broadcast block found in 60 seconds.",
             40)
    rollout = _step(rollout)
    assert rollout.state == State.STARTING, rollout.reason
    workers = rollout.progress["workers"]
    assert {slot: w["phase"] for slot, w in workers.items()} == {
        prefill.slot: "compiling", decode.slot: "compiling"}
    # Ready: the phase says so, and the rollout goes on.
    ManagedProcess.objects.filter(pk__in=[prefill.pk, decode.pk]).update(
        state=READY, ready_at=timezone.now())
    rollout = _step(rollout)
    assert rollout.state == State.STEPPING
    assert {w["phase"] for w in rollout.progress["workers"].values()} == {"ready"}


def test_no_progress_for_the_deadline_rolls_back_naming_the_worker_and_phase(
        plan: Deployment, draft: Revision) -> None:
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=120)
    _age(rollout, 200)
    prefill, decode = _green_processes(rollout, started_ago_s=200)
    _log(prefill, "INFO Warming up model for the compilation...", 10)   # progressing
    _log(decode, "INFO Starting to load model /m...", 130)              # silent 130 s
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert "did not become ready" in rollout.reason
    assert f"{decode.slot} made no progress" in rollout.reason
    assert "loading weights" in rollout.reason and prefill.slot not in rollout.reason


def _cpu(rollout: Rollout, by_slot: dict[str, float], seconds: range) -> None:
    """The collector's 1 s samples ``seconds`` ago, each green slot at its CPU %."""
    now = timezone.now()
    MetricSample.objects.bulk_create([MetricSample(
        deployment=rollout.deployment, resolution=MetricSample.Resolution.SECOND,
        created=now - timedelta(seconds=age),
        data={"processes": {slot: {"role": "decode", "up": 0, "cpu": cpu}
                            for slot, cpu in by_slot.items()}}) for age in seconds])


def test_a_silent_green_worker_busy_on_a_core_is_progressing_up_to_three_deadlines(
        plan: Deployment, draft: Revision) -> None:
    """make up's green decode compiled beside blue's for 7 min 42 s without a log line and was
    rolled back as hung; its CPU said it was computing."""
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=150)
    _age(rollout, 400)
    processes = _green_processes(rollout, started_ago_s=400)
    for process in processes:
        _log(process, "INFO Warming up model for the compilation...", 380)
    _cpu(rollout, {p.slot: 97.5 for p in processes}, range(380, 0, -1))
    rollout = _step(rollout)
    assert rollout.state == State.STARTING, rollout.reason
    workers = rollout.progress["workers"]
    assert {w["phase"] for w in workers.values()} == {"compiling"}
    assert {w["cpu"] for w in workers.values()} == {97.5}
    # Still busy, but silent in the log past three deadlines (450 s): a spin, not a start.
    Rollout.objects.filter(pk=rollout.pk).update(progress={**rollout.progress, "workers": {
        slot: {**entry, "log_at": (timezone.now() - timedelta(seconds=460)).isoformat()}
        for slot, entry in workers.items()}})
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert "wrote no log line for 460 s although busy on a core" in rollout.reason
    assert "3 x the deadline of 150 s" in rollout.reason


def test_a_silent_green_worker_idle_on_its_core_is_not_progressing(plan: Deployment,
                                                                    draft: Revision) -> None:
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=120)
    _age(rollout, 200)
    prefill, decode = _green_processes(rollout, started_ago_s=200)
    for process in (prefill, decode):
        _log(process, "INFO Warming up model for the compilation...", 190)
    _cpu(rollout, {prefill.slot: 95.0, decode.slot: 2.0}, range(190, 0, -1))
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert f"{decode.slot} made no progress" in rollout.reason
    assert prefill.slot not in rollout.reason


def test_progress_resets_the_deadline_tick_after_tick(plan: Deployment,
                                                       draft: Revision) -> None:
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=60)
    _age(rollout, 50)
    processes = _green_processes(rollout, started_ago_s=50)
    runner = RolloutRunner()
    assert _step(rollout, runner).state == State.STARTING
    # 50 s later (simulated by ageing what was seen), each has written again: still starting.
    _age(rollout, 100)
    for process in processes:
        LogLine.objects.filter(process=process).update(
            created=timezone.now() - timedelta(seconds=100))
        _log(process, "Loading safetensors checkpoint shards: 100% Completed | 1/1", 5)
    assert _step(rollout, runner).state == State.STARTING
    # Then nothing more for longer than the deadline: rolled back.
    Rollout.objects.filter(pk=rollout.pk).update(progress={"workers": {
        slot: {**entry, "progress_at": (timezone.now() - timedelta(seconds=61)).isoformat()}
        for slot, entry in rollout.progress["workers"].items()}})
    assert _step(rollout, runner).state == State.ROLLING_BACK


def test_a_green_worker_that_keeps_restarting_is_rolled_back(plan: Deployment,
                                                             draft: Revision) -> None:
    """Each restart writes a new header (progress): restarts are bounded on their own."""
    rollout = services.start(plan, draft, "canary", None, start_timeout_s=600)
    prefill, _ = _green_processes(rollout)
    assert _step(rollout).state == State.STARTING
    ManagedProcess.objects.filter(pk=prefill.pk).update(
        restarts=green_progress.MAX_RESTARTS, last_error="exited with code 1")
    _log(prefill, "=== pdserve 2026-12-04T05:16:01+00:00 starting prefill-0: vllm", 0)
    rollout = _step(rollout)
    assert rollout.state == State.ROLLING_BACK
    assert f"{prefill.slot} restarted {green_progress.MAX_RESTARTS} times" in rollout.reason


def test_the_default_deadline_follows_the_deployments_past_starts(plan: Deployment,
                                                                  draft: Revision) -> None:
    # No start recorded (the fixture's rows have no times): the old 600 s.
    assert green_progress.default_deadline(plan.pk)[0] == 600
    now = timezone.now()
    ManagedProcess.objects.filter(deployment=plan, slot="prefill-0").update(
        started_at=now - timedelta(seconds=150), ready_at=now)
    ManagedProcess.objects.filter(deployment=plan, slot="decode-0").update(
        started_at=now - timedelta(seconds=200), ready_at=now)
    value, why = green_progress.default_deadline(plan.pk)
    assert value == 600 and "200 s" in why  # 3 x the slowest
    rollout = services.start(plan, draft, "canary", None)
    assert rollout.start_timeout_s == 600
    assert "600 s without progress" in rollout.transitions.last().reason
    # Fast starts: the floor; very slow ones: the cap.
    ManagedProcess.objects.filter(deployment=plan).update(started_at=now - timedelta(seconds=20))
    assert green_progress.default_deadline(plan.pk)[0] == green_progress.DEADLINE_FLOOR_S
    ManagedProcess.objects.filter(deployment=plan).update(started_at=now - timedelta(hours=2))
    assert green_progress.default_deadline(plan.pk)[0] == green_progress.DEADLINE_CAP_S


@pytest.fixture
def team_plan(db: None, tmp_path: Path) -> tuple[Team, Deployment, Revision]:
    team = Team.objects.create(name="deadline-team")
    deployment = _ready(make_startable(make_plan(tmp_path, name="timed", team=team)))
    made, _ = revisions.create_draft(deployment, {"block_size": 32}, {}, None)
    return team, deployment, made


@pytest.mark.parametrize("value", [0, 29, 86_401, "soon", True])
def test_a_bad_deadline_is_a_400_naming_the_field(team_plan: tuple[Team, Deployment, Revision],
                                                  value: Any) -> None:
    team, deployment, made = team_plan
    client = token_client(team, Role.OPERATOR, "op")
    response = client.post("/api/v1/rollouts/", data={
        "deployment": deployment.pk, "revision": made.number, "strategy": "canary",
        "start_timeout_s": value}, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "start_timeout_s" in response.json()
    assert not Rollout.objects.exists()


def test_the_deadline_is_set_through_the_api(team_plan: tuple[Team, Deployment, Revision]
                                             ) -> None:
    team, deployment, made = team_plan
    client = token_client(team, Role.OPERATOR, "op")
    response = client.post("/api/v1/rollouts/", data={
        "deployment": deployment.pk, "revision": made.number, "strategy": "canary",
        "start_timeout_s": 1800}, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["start_timeout_s"] == 1800
    assert Rollout.objects.get().start_timeout_s == 1800
    assert "progress" in response.json()


def test_the_deadline_is_set_through_the_command(team_plan: tuple[Team, Deployment, Revision]
                                                 ) -> None:
    _, deployment, made = team_plan
    with pytest.raises(CommandError, match="--start-timeout-s"):
        call_command("rollout", "start", deployment.name, "--revision", str(made.number),
                     "--strategy", "canary", "--start-timeout-s", "5", stdout=StringIO())
    out = StringIO()
    call_command("rollout", "start", deployment.name, "--revision", str(made.number),
                 "--strategy", "canary", "--start-timeout-s", "900", stdout=out)
    assert "900 s without progress" in out.getvalue()
    assert Rollout.objects.get().start_timeout_s == 900


def test_the_deadline_is_set_on_the_page_and_the_page_shows_green_phases(
        team_plan: tuple[Team, Deployment, Revision]) -> None:
    team, deployment, made = team_plan
    user = User.objects.create_user("pageop", "", "pw")
    Membership.objects.create(team=team, user=user, role=Role.OPERATOR)
    client = Client()
    client.force_login(user)
    listing = client.get(f"/deployments/{deployment.name}/revisions/").content.decode()
    assert 'name="start_timeout_s"' in listing
    url = f"/deployments/{deployment.name}/revisions/{made.number}/rollout/"
    bad = client.post(url, {"strategy": "canary", "start_timeout_s": "3"})
    assert bad.status_code == 400 and "start_timeout_s" in bad.content.decode()
    assert client.post(url, {"strategy": "canary", "start_timeout_s": "1200"}).status_code == 302
    rollout = Rollout.objects.get()
    assert rollout.start_timeout_s == 1200
    prefill, _ = _green_processes(rollout, started_ago_s=30)
    _log(prefill, "INFO Warming up model for the compilation...", 3)
    _step(rollout)
    page = client.get(f"/rollouts/{rollout.pk}/").content.decode()
    assert 'id="green-workers"' in page and f'id="green-{prefill.slot}"' in page
    assert "compiling" in page and 'data-deadline="1200"' in page


# ---- analysis at low traffic ---------------------------------------------------------------

def _metrics(counts: dict[str, int]) -> str:
    """The router's /metrics with ``counts`` requests per revision, all 200 and fast."""
    lines = []
    for revision, n in counts.items():
        lines.append(f'pdserve_router_requests_total{{revision="{revision}",status="200"}} {n}')
        for name in ("ttft", "itl", "tpot"):
            for le in ("0.1", "+Inf"):
                lines.append(f'pdserve_router_{name}_seconds_bucket{{revision="{revision}",'
                             f'le="{le}"}} {n}')
    return "\n".join(lines) + "\n"


class FakeRouter(RolloutRunner):
    """The runner with the router replaced at its edge: its /metrics counters, a clock the test
    moves, and admin calls that do nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.now = 0.0
        self.counts: dict[str, int] = {}
        self.clock = lambda: self.now

    def _scrape(self, deployment: Deployment) -> analysis.Scrape:
        return analysis.parse(_metrics(self.counts))

    @staticmethod
    def _router_ready(deployment: Deployment) -> bool:
        return True

    def _sync_router(self, rollout: Rollout) -> None:
        return None

    def _delete_group(self, rollout: Rollout, label: str) -> None:
        return None

    def _drained(self, rollout: Rollout, label: str) -> bool:
        return True

    def tick(self, seconds: float, **requests: int) -> None:
        self.now += seconds
        for revision, n in requests.items():
            self.counts[revision.removeprefix("r")] = self.counts.get(
                revision.removeprefix("r"), 0) + n
        self.step({})


@pytest.fixture
def stepping(plan: Deployment, draft: Revision) -> Rollout:
    rollout = services.start(plan, draft, "canary", None,
                             steps=[{"weight": 10, "hold_s": 0}, {"weight": 100, "hold_s": 0}],
                             scale_down_delay_s=0)
    for spec in green_specs(plan, rollout):
        ManagedProcess.objects.create(deployment=plan, slot=spec.slot, role=spec.role,
                                      port=spec.port, state=READY, log_path="/dev/null")
    rollout = _step(rollout)
    assert rollout.state == State.STEPPING
    return rollout


def test_a_slow_trickle_grows_the_window_until_it_decides(stepping: Rollout) -> None:
    """0.5 req/s, green at 10%: ~0.05 green req/s. Fixed 10 s windows were all inconclusive,
    forever; the window now grows until green has its 20 requests (~400 s), then passes."""
    router = FakeRouter()
    router.tick(0)  # the window opens
    for _ in range(39):  # 390 s: 175 blue, 19 green requests
        router.tick(10, r1=5, r2=0)
        router.counts["2"] = router.counts.get("2", 0) + (1 if _ % 2 == 0 else 0)
    stepping.refresh_from_db()
    assert stepping.state == State.STEPPING
    assert not AnalysisRun.objects.filter(rollout=stepping).exists()  # no silent hold rows
    window = stepping.progress["window"]
    assert window["requests"]["1"] >= 20 and window["requests"]["2"] < 20
    router.tick(10, r1=5, r2=2)
    [run] = AnalysisRun.objects.filter(rollout=stepping)
    assert run.verdict == analysis.PASS and run.window_s >= 390
    assert run.requests["2"] >= 20
    router.tick(1)
    stepping.refresh_from_db()
    assert stepping.step_index == 1  # the step advanced on the long window's pass


def test_past_the_bound_the_rollout_pauses_and_can_be_promoted_or_rolled_back(
        stepping: Rollout) -> None:
    bound = services.DEFAULT_MAX_INCONCLUSIVE_S
    router = FakeRouter()
    router.tick(0)
    for _ in range(bound // 10):
        router.tick(10, r1=1, r2=0)
    stepping.refresh_from_db()
    assert stepping.state == State.PAUSED and stepping.paused_from == State.STEPPING
    assert stepping.reason.startswith("inconclusive: not enough traffic")
    [run] = AnalysisRun.objects.filter(rollout=stepping)
    assert run.verdict == analysis.INCONCLUSIVE
    # Paused, it holds still (no endless windows), and offers promote and roll back.
    router.tick(bound, r1=100, r2=100)
    assert AnalysisRun.objects.filter(rollout=stepping).count() == 1
    promoted = services.promote(stepping)
    assert promoted.state == State.STEPPING
    router.tick(1)
    router.tick(1)
    promoted.refresh_from_db()
    assert promoted.state in (State.WARM, State.DRAINING, State.SUCCEEDED), promoted.reason


def test_a_paused_inconclusive_rollout_rolls_back(stepping: Rollout) -> None:
    router = FakeRouter(**{})
    Rollout.objects.filter(pk=stepping.pk).update(
        analysis={**stepping.analysis, "max_inconclusive_s": 60})
    router.tick(0)
    for _ in range(6):
        router.tick(10)
    stepping.refresh_from_db()
    assert stepping.state == State.PAUSED
    assert services.rollback(stepping).state == State.ROLLING_BACK


def test_blue_greens_analysis_waits_for_a_decision_and_pauses_past_the_bound(
        plan: Deployment, draft: Revision) -> None:
    rollout = services.start(plan, draft, "blue_green", None, scale_down_delay_s=0,
                             analysis={"max_inconclusive_s": 60})
    for spec in green_specs(plan, rollout):
        ManagedProcess.objects.create(deployment=plan, slot=spec.slot, role=spec.role,
                                      port=spec.port, state=READY, log_path="/dev/null")
    router = FakeRouter()
    router.tick(0)  # starting -> stepping at 100%
    router.tick(0)  # -> warm; the window opens
    rollout.refresh_from_db()
    assert rollout.state == State.WARM
    router.tick(10, r2=3)
    rollout.refresh_from_db()
    assert rollout.state == State.WARM  # the delay is over, but nothing was decided yet
    for _ in range(6):
        router.tick(10, r2=1)
    rollout.refresh_from_db()
    assert (rollout.state, rollout.paused_from) == (State.PAUSED, State.WARM)
    assert rollout.reason.startswith("inconclusive: not enough traffic")


def test_blue_green_under_traffic_decides_without_blue_and_drains(plan: Deployment,
                                                                   draft: Revision) -> None:
    """Blue takes nothing at blue-green's one step and has no earlier window: the limits
    relative to it are skipped (not inconclusive forever); the error rates decide."""
    rollout = services.start(plan, draft, "blue_green", None, scale_down_delay_s=0)
    for spec in green_specs(plan, rollout):
        ManagedProcess.objects.create(deployment=plan, slot=spec.slot, role=spec.role,
                                      port=spec.port, state=READY, log_path="/dev/null")
    router = FakeRouter()
    router.tick(0)
    router.tick(0)
    router.tick(10)  # warm; the window opens
    router.tick(10, r2=25)
    [run] = AnalysisRun.objects.filter(rollout=rollout)
    assert run.verdict == analysis.PASS
    assert run.metrics["ttft_p95"]["verdict"] == analysis.SKIPPED
    assert run.metrics["error_rate"]["verdict"] == analysis.PASS
    router.tick(1)
    rollout.refresh_from_db()
    assert rollout.state in (State.DRAINING, State.SUCCEEDED), rollout.reason


@pytest.mark.parametrize(("analysis_body", "field"), [
    ({"max_inconclusive_s": 0}, "analysis.max_inconclusive_s"),
    ({"interval_s": 30, "max_inconclusive_s": 20}, "analysis.max_inconclusive_s"),
])
def test_a_bad_bound_is_a_400_naming_it(team_plan: tuple[Team, Deployment, Revision],
                                        analysis_body: dict[str, Any], field: str) -> None:
    team, deployment, made = team_plan
    client = token_client(team, Role.OPERATOR, "op")
    response = client.post("/api/v1/rollouts/", data={
        "deployment": deployment.pk, "revision": made.number, "strategy": "canary",
        "analysis": analysis_body}, content_type="application/json")
    assert response.status_code == 400 and field in response.json(), response.content


# ---- alert rules after a topology switch -----------------------------------------------------

def test_a_switch_to_colocated_and_back_remakes_the_rules_keeping_edited_thresholds(
        plan: Deployment, tmp_path: Path) -> None:
    rules = AlertRule.objects.filter(deployment=plan)
    rules.filter(key="tpot_slo").update(threshold=0.35)          # edited by a user
    rules.filter(key="handoff_failures").update(threshold=0.2)   # PD-only, edited
    variant = plan.workers.get(role="decode").variant
    colocated, _ = revisions.create_draft(plan, {"mode": "colocated", "gate_mode": "off"},
                                          {"colocated": variant}, None)
    rollout = services.start(plan, colocated, "blue_green", None, scale_down_delay_s=0)
    for spec in green_specs(plan, rollout):
        ManagedProcess.objects.create(deployment=plan, slot=spec.slot, role=spec.role,
                                      port=spec.port, state=READY, log_path="/dev/null")
    services.promote(Rollout.objects.get(pk=_step(rollout).pk))
    for _ in range(4):
        rollout = _step(rollout)
    assert rollout.state == State.SUCCEEDED, rollout.reason
    plan.refresh_from_db()
    assert plan.mode == Deployment.Mode.COLOCATED
    tpot = rules.get(key="tpot_slo")
    assert (tpot.role, tpot.threshold) == ("colocated", 0.35)
    queue = rules.get(key="decode_queue")
    assert (queue.role, queue.name) == ("colocated", "Colocated queue")
    pd_only = rules.filter(key__in=("role_unavailable", "handoff_failures", "prefill_queue",
                                    "pd_fallback", "pd_load_skew"))
    assert pd_only.count() == 5 and not pd_only.filter(enabled=True).exists()
    # And back to PD: the rules follow again, the edited thresholds still as set.
    back = services.rollback_to_previous(plan, None)
    Rollout.objects.filter(pk=back.pk).update(scale_down_delay_s=0)
    for spec in green_specs(plan, back):
        ManagedProcess.objects.update_or_create(
            deployment=plan, slot=spec.slot, defaults={"role": spec.role, "port": spec.port,
                                                       "state": READY, "log_path": "/dev/null"})
    services.promote(Rollout.objects.get(pk=_step(back).pk))
    for _ in range(4):
        back = _step(back)
    assert back.state == State.SUCCEEDED, back.reason
    assert rules.get(key="tpot_slo").role == "decode"
    assert rules.get(key="tpot_slo").threshold == 0.35
    assert rules.get(key="decode_queue").name == "Decode queue"
    assert pd_only.filter(enabled=True).count() == 5
    assert rules.get(key="handoff_failures").threshold == 0.2


@pytest.mark.django_db(transaction=True)
async def test_green_progress_reaches_the_rollout_page_live(tmp_path: Path) -> None:
    """A phase change is no transition: the hub sends the rollout when its progress changed."""
    from tests.console.test_rollout_pages import (
        ORIGIN,
        _receive_rollout,
        _session,
        _world,
    )

    world = await sync_to_async(_world)(tmp_path)
    rollout = await sync_to_async(services.start)(world["plan"], world["draft"], "canary",
                                                  world["operator"])
    cookie = await sync_to_async(_session)(world["viewer"])
    communicator = WebsocketCommunicator(
        application, f"/ws/deployments/{world['plan'].pk}/live/", headers=[ORIGIN, cookie])
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    try:
        async def keep_progressing() -> None:
            # The hub starts from "now" once it has read what it has seen: change until sent.
            for attempt in range(60):
                phase = {"phase": "compiling", "progress_at": timezone.now().isoformat(),
                         "attempt": attempt}
                await sync_to_async(Rollout.objects.filter(pk=rollout.pk).update)(
                    progress={"workers": {"prefill-0@r2": phase}})
                await asyncio.sleep(0.3)

        writer = asyncio.create_task(keep_progressing())
        try:
            message = await _receive_rollout(communicator, timeout=15.0)
        finally:
            writer.cancel()
        assert message is not None
        workers = message["rollout"]["progress"]["workers"]
        assert workers["prefill-0@r2"]["phase"] == "compiling"
        assert message["rollout"]["start_timeout_s"] == rollout.start_timeout_s
        assert message["transitions"] == []
    finally:
        await communicator.disconnect()
