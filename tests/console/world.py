"""Two teams and one of every object, for the tests generated from the URL list.

Team ``alpha`` owns a deployment, its process, key, usage, gate result and audit entry; team
``bravo`` owns the same kinds of object. Users: a superuser, alpha's viewer, operator and admin,
and bravo's admin, who is an outsider to everything of alpha's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.contrib.auth.models import User
from django.utils import timezone

from console.accounts.models import Membership, Role, Team
from console.alerts.models import Alert, AlertEvent, AlertRule, Delivery, Notifier, Silence
from console.audit.actors import acting_as
from console.audit.entries import record
from console.catalog.models import BaseModel, QuantizationJob, Variant
from console.deployments.defaults import ensure_default_deployment
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node
from console.gateway.aliases import create_alias
from console.gateway.models import ApiKey, ModelAlias, UsageDay
from console.gateway.services import create_key
from console.quality.models import GateResult, VariantMeasurement
from console.rollouts import revisions as revision_store
from console.rollouts.models import Revision, Rollout, RolloutTransition
from console.supervisor.models import ManagedProcess
from console.verification.models import VerificationReport
from tests.console.tiny_models import make_startable, write_model
from tests.console.tokens import token_for

# Text that names alpha's objects: none of it may reach an outsider.
ALPHA_NAMES = ("alpha-dep", "alpha-key", "alpha")


@dataclass
class World:
    alpha: Team
    bravo: Team
    root: User
    viewer: User
    operator: User
    admin: User
    outsider: User
    deployment: Deployment
    other_deployment: Deployment
    process: ManagedProcess
    key: ApiKey
    alias: ModelAlias
    gate: GateResult
    base_model: BaseModel
    variant: Variant
    node: Node
    job: QuantizationJob
    measurement: VariantMeasurement
    entry_id: int
    tokens: dict[str, str]
    viewer_token_id: int
    # A tiny model directory no variant uses yet, to register.
    spare_dir: str
    alert_rule: AlertRule
    alert: Alert
    silence: Silence
    notifier: Notifier
    delivery: Delivery
    # r1 live, r2 a draft, and a canary rollout from one to the other taking 10%.
    revision: Revision | None = None
    rollout: Rollout | None = None
    verification: VerificationReport | None = None

    def user(self, name: str) -> User:
        return getattr(self, name)


def _user(name: str, team: Team | None, role: Role | None, *, superuser: bool = False) -> User:
    user = (User.objects.create_superuser(name, "", "pw") if superuser
            else User.objects.create_user(name, "", "pw"))
    if team is not None and role is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


def _process(deployment: Deployment, port: int) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                         port=port, state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


def _alerting(deployment: Deployment, user: User
              ) -> tuple[AlertRule, Alert, Silence, Notifier, Delivery]:
    """A firing alert of the deployment's ready-made worker-down rule with its history, a
    silence, a webhook notifier and one delivery: one of each alerting object."""
    now = timezone.now()
    rule = AlertRule.objects.get(deployment=deployment, key="worker_down")
    labels = {"alertname": "WorkerDown", "deployment": deployment.name, "process": "decode-0"}
    alert = Alert.objects.create(rule=rule, deployment=deployment, fingerprint=deployment.name[:16],
                                 labels=labels, state="firing", value=0.0, active_since=now,
                                 fired_at=now, evaluated_at=now)
    AlertEvent.objects.create(alert=alert, deployment=deployment, at=now, from_state="inactive",
                              to_state="firing", value=0.0)
    silence = Silence.objects.create(
        team=deployment.team, matchers=[{"name": "deployment", "op": "=", "value": deployment.name}],
        starts_at=now, ends_at=now + timedelta(hours=1), comment="maintenance",
        created_by=user)
    notifier = Notifier.objects.create(team=deployment.team, name=f"{deployment.team.name}-hook",
                                       kind="webhook", url="http://127.0.0.1:9/hook")
    delivery = Delivery.objects.create(notifier=notifier, deployment=deployment, status="firing",
                                       payload={"version": "4"}, next_attempt_at=now)
    return rule, alert, silence, notifier, delivery


def _usage(deployment: Deployment, key: ApiKey) -> UsageDay:
    """A day of the key's use of the deployment, as the key sync stores a router's ledger."""
    return UsageDay.objects.create(
        day=timezone.now().date(), deployment=deployment, deployment_name=deployment.name,
        key=key, router_key=str(key.pk), key_prefix=key.prefix, team=key.team,
        model=deployment.served_model_name, requests=3, errors=1, prompt_tokens=120,
        completion_tokens=48, latency_ms_sum=812.5)


def _gate(deployment: Deployment) -> GateResult:
    return GateResult.objects.create(deployment=deployment, trigger=GateResult.Trigger.DEMAND,
                                     state=GateResult.State.PASSED, prompts=1, min_agreement=0.9,
                                     max_mean_delta=0.5, action="block")


def _rolling(deployment: Deployment, user: User) -> tuple[Revision, Rollout]:
    """The live revision, a draft with other sampling defaults, and a canary rollout between
    them at its first step (stored directly: no supervisor runs it)."""
    live = revision_store.ensure_live(deployment)
    draft = Revision.objects.create(deployment=deployment, number=live.number + 1,
                                    spec={**live.spec, "sampling_defaults": {"temperature": 0.5}},
                                    note="cooler", created_by=user)
    rollout = Rollout.objects.create(
        deployment=deployment, from_revision=live, to_revision=draft, strategy="canary",
        state=Rollout.State.STEPPING, steps=[{"weight": 10, "hold_s": 60},
                                             {"weight": 100, "hold_s": 0}],
        weights={live.label: 90, draft.label: 10}, analysis={"failure_limit": 1, "metrics": {}},
        state_since=timezone.now(), step_since=timezone.now(), created_by=user)
    RolloutTransition.objects.create(rollout=rollout, from_state="starting", to_state="stepping",
                                     actor="supervisor", reason="green took 10%",
                                     weights=rollout.weights)
    return draft, rollout


def _verification(deployment: Deployment) -> VerificationReport:
    return VerificationReport.objects.create(
        deployment=deployment, trigger=VerificationReport.Trigger.DEMAND, budget_s=60,
        state=VerificationReport.State.DONE, verdict=VerificationReport.Verdict.PASS)


def build_world(tmp_path: Path) -> World:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    alpha = Team.objects.create(name="alpha")
    bravo = Team.objects.create(name="bravo")
    with acting_as("command", "world"):
        default, _ = ensure_default_deployment(model_dir=model_dir)
    Deployment.objects.filter(pk=default.pk).update(name="alpha-dep", team=alpha)
    # Real (tiny) model files and free ports: every check passes, so start and gate run.
    deployment = make_startable(Deployment.objects.get(pk=default.pk))
    other = Deployment.objects.create(name="bravo-dep", team=bravo, base_model=deployment.base_model,
                                      served_model_name="bravo", router_port=9100)
    worker = deployment.workers.first()
    assert worker is not None
    WorkerPlan.objects.create(deployment=other, role="decode", variant=worker.variant, port=9101)
    users = {
        "root": _user("root", None, None, superuser=True),
        "viewer": _user("viewer", alpha, Role.VIEWER),
        "operator": _user("operator", alpha, Role.OPERATOR),
        "admin": _user("admin", alpha, Role.ADMIN),
        "outsider": _user("outsider", bravo, Role.ADMIN),
    }
    with acting_as("command", "world"):
        key, _ = create_key(name="alpha-key", team=alpha, deployments=[deployment],
                            all_deployments=False, limits={}, user=users["admin"])
        bravo_key, _ = create_key(name="bravo-key", team=bravo, deployments=[other],
                                  all_deployments=False, limits={}, user=users["outsider"])
        alias = create_alias(name="alpha-alias", team=alpha, targets=[deployment],
                             user=users["admin"])
        create_alias(name="bravo-alias", team=bravo, targets=[other], user=users["outsider"])
        entry = record("deployment.edit", deployment, before={"concurrency": 1},
                       after={"concurrency": 2})
    _process(other, 9102)
    _gate(other)
    _usage(deployment, key)
    _usage(other, bravo_key)
    variant = worker.variant
    node = Node.objects.get(is_local=True)
    job = QuantizationJob.objects.create(base=deployment.base_model, source=variant, name="w8",
                                         path=str(tmp_path / "w8"), scheme="w8a8", method="gptq",
                                         state=QuantizationJob.State.FAILED)
    measurement = VariantMeasurement.objects.create(variant=variant, node=node, dtype="float32",
                                                    state=VariantMeasurement.State.DONE)
    tokens = {name: token_for(user) for name, user in users.items()}
    _alerting(other, users["outsider"])
    rule, alert, silence, notifier, delivery = _alerting(deployment, users["admin"])
    viewer_token_id = users["viewer"].api_tokens.get().pk
    with acting_as("command", "world"):
        revision, rollout = _rolling(deployment, users["admin"])
    return World(alpha=alpha, bravo=bravo, **users, deployment=deployment, other_deployment=other,
                 process=_process(deployment, 9002), key=key, alias=alias, gate=_gate(deployment),
                 base_model=deployment.base_model, variant=variant, node=node, job=job,
                 measurement=measurement, entry_id=entry.pk, tokens=tokens,
                 viewer_token_id=viewer_token_id,
                 spare_dir=str(write_model(tmp_path / "models" / "spare")), alert_rule=rule,
                 alert=alert, silence=silence, notifier=notifier, delivery=delivery,
                 revision=revision, rollout=rollout, verification=_verification(deployment))
