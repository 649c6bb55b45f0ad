"""The audit log, generated from the URL list: every method of every path that changes
something writes exactly one entry, naming the user who made the change.

A path and method that answers (anything but 405) must be in ``CHANGES`` (with a request that
succeeds) or in ``READS`` (with why it changes nothing): a new endpoint fails until it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from console.accounts.models import Team
from console.advisor.models import SpeedProfile
from console.audit.models import AuditEntry
from console.autoscaling.models import PoolPolicy, RatioBand
from console.catalog.models import BaseModel, QuantizationJob
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.fleet.services import local_node
from console.gateway.models import TeamBudget
from console.rollouts.models import Revision, Rollout
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port
from tests.console.test_advisor import SPEEDS as ADVISED_SPEEDS
from tests.console.test_permissions_generated import KINDS, PUBLIC, call, client_for, values
from tests.console.test_plans import form_data
from tests.console.tiny_models import register
from tests.console.url_list import UNSAFE, fill, is_api
from tests.console.world import World

Body = Callable[[World], dict[str, Any]]


@dataclass(frozen=True)
class Change:
    who: str          # the world's user who makes it
    body: Body        # what is sent
    action: str       # the entry's action
    # Further entries of a change that is two changes in one (the advice's one click drafts a
    # revision and starts its rollout), in order after ``action``.
    also: tuple[str, ...] = ()


def _none(_w: World) -> dict[str, Any]:
    return {}


def _plan(w: World, name: str = "audited") -> dict[str, Any]:
    variant = w.variant.pk
    return {"name": name, "team": "alpha", "base_model": w.base_model.name,
            "served_model_name": name, "max_model_len": 2048, "longest_request": 1024,
            "prefill": {"variant": variant, "instances": [{}]},
            "decode": {"variant": variant, "instances": [{}]},
            "router": {"port": free_port()}}


def _plan_form(w: World, name: str = "audited-form") -> dict[str, Any]:
    return form_data(w.variant, local_node(), name=name, team=str(w.alpha.pk))


def _edit_form(w: World) -> dict[str, Any]:
    data = _plan_form(w, w.deployment.name)
    data["concurrency"] = "4"
    return data


def _rule_form(w: World, threshold: str = "4") -> dict[str, Any]:
    return {"deployment": str(w.deployment.pk), "name": "queue", "enabled": "on",
            "series": "worker.waiting", "role": "", "aggregation": "avg", "window_s": "60",
            "comparison": ">", "threshold": threshold, "for_s": "0", "keep_firing_for_s": "0",
            "severity": "warning", "scope": "deployment", "labels": "{}", "summary": "",
            "runbook_url": "", "min_count": "0", "nodata": "nodata", "inhibits": "[]"}


def _policy_form(_w: World) -> dict[str, Any]:
    return {"mode": "dry_run", "signal": "queue", "min_instances": "1", "max_instances": "2",
            "scale_up_at": "", "scale_down_at": "", "up_window_s": "60", "down_window_s": "300",
            "max_step": "1", "cooldown_s": "300", "schedules": "[]"}


def _node(_w: World) -> dict[str, Any]:
    return {"name": "far", "address": "10.0.0.9", "cpu_count": 2, "memory_gib": 16,
            "gpus": [], "engine_version": "0.32.0"}


CHANGES: dict[tuple[str, str], Change] = {
    # deployments
    ("api/v1/deployments/", "post"): Change("admin", _plan, "deployment.create"),
    ("api/v1/deployments/{pk}/", "put"): Change("admin", lambda w: _plan(w, w.deployment.name),
                                                "deployment.edit"),
    ("api/v1/deployments/{pk}/", "patch"): Change("admin", lambda w: {"concurrency": 4},
                                                  "deployment.edit"),
    ("api/v1/deployments/{pk}/", "delete"): Change("admin", _none, "deployment.delete"),
    ("api/v1/deployments/{pk}/start/", "post"): Change("operator", _none, "deployment.start"),
    ("api/v1/deployments/{pk}/stop/", "post"): Change("operator", _none, "deployment.stop"),
    ("api/v1/deployments/{pk}/gate/", "post"): Change("operator", _none, "gate.run"),
    ("api/v1/deployments/{pk}/verifications/", "post"): Change(
        "operator", lambda w: {"budget_s": 60}, "verification.run"),
    ("deployments/{name}/verify/", "post"): Change("operator", _none, "verification.run"),
    ("deployments/new/", "post"): Change("admin", _plan_form, "deployment.create"),
    ("deployments/{name}/edit/", "post"): Change("admin", _edit_form, "deployment.edit"),
    ("deployments/{name}/start/", "post"): Change("operator", _none, "deployment.start"),
    ("deployments/{name}/stop/", "post"): Change("operator", _none, "deployment.stop"),
    ("deployments/{name}/gate/run/", "post"): Change("operator", _none, "gate.run"),
    ("deployments/{name}/advice/measure/", "post"): Change(
        "operator", lambda w: {"variant": str(w.variant.pk), "node": str(w.node.pk)},
        "measurement.start"),
    # keys
    ("api/v1/keys/", "post"): Change("operator", lambda w: {
        "name": "k2", "team": "alpha", "deployments": [w.deployment.name]}, "key.create"),
    ("api/v1/keys/{pk}/", "put"): Change("operator", lambda w: {
        "name": "k3", "deployments": [w.deployment.name]}, "key.edit"),
    ("api/v1/keys/{pk}/", "patch"): Change("operator", lambda w: {"name": "k4"}, "key.edit"),
    ("api/v1/keys/{pk}/revoke/", "post"): Change("operator", _none, "key.revoke"),
    # token budgets of teams
    ("api/v1/team-budgets/{name}/", "put"): Change("admin", lambda w: {
        "budget_tokens": 1000, "budget_period": "day"}, "team_budget.edit"),
    ("api/v1/team-budgets/{name}/", "patch"): Change("admin", lambda w: {"budget_tokens": 2000},
                                                     "team_budget.edit"),
    ("api/v1/team-budgets/{name}/", "delete"): Change("admin", _none, "team_budget.delete"),
    ("keys/new/", "post"): Change("operator", lambda w: {
        "name": "k5", "team": str(w.alpha.pk), "deployments": [w.deployment.name]},
        "key.create"),
    ("keys/{pk}/revoke/", "post"): Change("operator", _none, "key.revoke"),
    # aliases at the gateway
    ("api/v1/aliases/", "post"): Change("operator", lambda w: {
        "name": "a2", "team": "alpha", "targets": [w.deployment.name]}, "alias.create"),
    ("api/v1/aliases/{pk}/", "put"): Change("operator", lambda w: {
        "name": "a3", "targets": [w.deployment.name]}, "alias.edit"),
    ("api/v1/aliases/{pk}/", "patch"): Change("operator", lambda w: {"name": "a4"}, "alias.edit"),
    ("api/v1/aliases/{pk}/", "delete"): Change("operator", _none, "alias.delete"),
    ("gateway/aliases/new/", "post"): Change("operator", lambda w: {
        "name": "a5", "team": str(w.alpha.pk), "targets": w.deployment.name}, "alias.create"),
    ("gateway/aliases/{pk}/delete/", "post"): Change("operator", _none, "alias.delete"),
    # measurements
    ("api/v1/measurements/", "post"): Change(
        "operator", lambda w: {"variant": w.variant.pk}, "measurement.start"),
    # catalog
    ("api/v1/models/", "post"): Change("root", lambda w: {"name": "m2"}, "model.create"),
    ("api/v1/models/{pk}/", "delete"): Change("root", _none, "model.delete"),
    ("api/v1/variants/{pk}/", "delete"): Change("root", _none, "variant.delete"),
    ("api/v1/quantization-jobs/{pk}/cancel/", "post"): Change("root", _none, "job.cancel"),
    ("models/jobs/{pk}/cancel/", "post"): Change("root", _none, "job.cancel"),
    ("api/v1/models/{pk}/", "put"): Change("root", lambda w: {
        "name": w.base_model.name, "description": "d"}, "model.edit"),
    ("api/v1/models/{pk}/", "patch"): Change("root", lambda w: {"description": "e"},
                                             "model.edit"),
    ("api/v1/variants/", "post"): Change("root", lambda w: {
        "base_model": w.base_model.name, "name": "copy", "path": w.spare_dir}, "variant.create"),
    ("api/v1/variants/{pk}/", "put"): Change("root", lambda w: {"name": "renamed"},
                                             "variant.edit"),
    ("api/v1/variants/{pk}/", "patch"): Change("root", lambda w: {"name": "renamed"},
                                               "variant.edit"),
    ("api/v1/variants/{pk}/inspect/", "post"): Change("root", _none, "variant.reinspect"),
    ("api/v1/quantization-jobs/", "post"): Change("root", lambda w: {
        "base_model": w.base_model.name, "scheme": "w8a8-int8"}, "job.start"),
    ("models/new/", "post"): Change("root", lambda w: {"base-name": "m3", "base-description": ""},
                                    "model.create"),
    ("models/register/", "post"): Change("root", lambda w: {
        "variant-base": str(w.base_model.pk), "variant-name": "copy2",
        "variant-path": w.spare_dir}, "variant.create"),
    ("models/variants/{pk}/inspect/", "post"): Change("root", _none, "variant.reinspect"),
    ("models/{pk}/quantize/", "post"): Change("root", lambda w: {
        f"quantize-{w.base_model.pk}-scheme": "w8a8-int8"}, "job.start"),
    # fleet
    ("api/v1/nodes/", "post"): Change("root", _node, "node.create"),
    ("api/v1/nodes/{pk}/", "put"): Change("root", lambda w: {**_node(w), "name": w.node.name,
                                                             "address": w.node.address},
                                          "node.edit"),
    ("api/v1/nodes/{pk}/", "delete"): Change("root", _none, "node.delete"),
    ("nodes/{pk}/delete/", "post"): Change("root", _none, "node.delete"),
    ("api/v1/nodes/{pk}/", "patch"): Change("root", lambda w: {"engine_version": "0.32.1"},
                                            "node.edit"),
    ("api/v1/nodes/discover/", "post"): Change("root", _none, "node.discover"),
    ("nodes/new/", "post"): Change("root", lambda w: {
        "name": "far2", "address": "10.0.0.8", "engine_version": "0.32.0", "cpu_count": "2",
        "memory_gib": "16", "gpus": ""}, "node.create"),
    ("nodes/discover/", "post"): Change("root", _none, "node.discover"),
    # teams and users
    ("api/v1/teams/", "post"): Change("root", lambda w: {"name": "charlie"}, "team.create"),
    ("api/v1/teams/{pk}/", "put"): Change("admin", lambda w: {
        "name": "alpha", "description": "the first"}, "team.edit"),
    ("api/v1/teams/{pk}/", "patch"): Change("admin", lambda w: {"description": "x"},
                                            "team.edit"),
    ("api/v1/teams/{pk}/", "delete"): Change("root", _none, "team.delete"),
    ("teams/{name}/delete/", "post"): Change("root", _none, "team.delete"),
    ("api/v1/teams/{pk}/members/", "post"): Change("admin", lambda w: {
        "user": w.outsider.username, "role": "viewer"}, "member.add"),
    ("api/v1/teams/{pk}/members/{user_id}/", "patch"): Change(
        "admin", lambda w: {"role": "operator"}, "member.role"),
    ("api/v1/teams/{pk}/members/{user_id}/", "delete"): Change("admin", _none, "member.remove"),
    ("api/v1/users/", "post"): Change("root", lambda w: {
        "username": "newcomer", "password": "a long enough passphrase 42"}, "user.create"),
    ("api/v1/users/{pk}/", "patch"): Change("root", lambda w: {"first_name": "Vi"}, "user.edit"),
    ("teams/", "post"): Change("root", lambda w: {"name": "delta", "description": ""},
                               "team.create"),
    ("teams/{name}/edit/", "post"): Change("admin", lambda w: {
        "name": "alpha", "description": "edited"}, "team.edit"),
    ("teams/{name}/members/", "post"): Change("admin", lambda w: {
        "user": w.outsider.username, "role": "viewer"}, "member.add"),
    ("teams/{name}/members/{user_id}/role/", "post"): Change(
        "admin", lambda w: {"role": "operator"}, "member.role"),
    ("teams/{name}/members/{user_id}/remove/", "post"): Change("admin", _none, "member.remove"),
    ("users/", "post"): Change("root", lambda w: {
        "username": "newcomer2", "password": "a long enough passphrase 43"}, "user.create"),
    ("users/{pk}/deactivate/", "post"): Change("root", _none, "user.deactivate"),
    ("users/{pk}/activate/", "post"): Change("root", _none, "user.activate"),
    # alerting
    ("api/v1/alert-rules/", "post"): Change("admin", lambda w: {
        "deployment": w.deployment.name, "name": "queue", "series": "worker.waiting",
        "threshold": 5}, "alert_rule.create"),
    ("api/v1/alert-rules/{pk}/", "put"): Change("admin", lambda w: {
        "deployment": w.deployment.name, "name": "down", "series": "process.up",
        "threshold": 1, "comparison": "<"}, "alert_rule.edit"),
    ("api/v1/alert-rules/{pk}/", "patch"): Change("admin", lambda w: {"threshold": 0.5},
                                                  "alert_rule.edit"),
    ("api/v1/alert-rules/{pk}/", "delete"): Change("admin", _none, "alert_rule.delete"),
    ("api/v1/alerts/{pk}/acknowledge/", "post"): Change("operator", lambda w: {
        "comment": "on it"}, "alert.acknowledge"),
    ("api/v1/silences/", "post"): Change("operator", lambda w: {
        "team": "alpha", "matchers": [{"name": "alertname", "op": "=", "value": "WorkerDown"}],
        "starts_at": "2026-01-01T00:00:00Z", "ends_at": "2036-01-01T00:00:00Z",
        "comment": "upgrade"}, "silence.create"),
    ("api/v1/silences/{pk}/expire/", "post"): Change("operator", _none, "silence.expire"),
    ("api/v1/notifiers/", "post"): Change("admin", lambda w: {
        "team": "alpha", "name": "pager", "kind": "webhook", "url": "https://hooks.example.com/p"},
        "notifier.create"),
    ("api/v1/notifiers/{pk}/", "put"): Change("admin", lambda w: {
        "name": "hook2", "kind": "webhook", "url": "https://hooks.example.com/q"}, "notifier.edit"),
    ("api/v1/notifiers/{pk}/", "patch"): Change("admin", lambda w: {"enabled": False},
                                                "notifier.edit"),
    ("api/v1/notifiers/{pk}/", "delete"): Change("admin", _none, "notifier.delete"),
    ("alerts/rules/new/", "post"): Change("admin", lambda w: _rule_form(w), "alert_rule.create"),
    ("alerts/rules/{pk}/", "post"): Change("admin", lambda w: _rule_form(w, threshold="2"),
                                           "alert_rule.edit"),
    ("alerts/rules/{pk}/delete/", "post"): Change("admin", _none, "alert_rule.delete"),
    ("alerts/{pk}/acknowledge/", "post"): Change("operator", lambda w: {"comment": "on it"},
                                                 "alert.acknowledge"),
    ("alerts/{pk}/silence/", "post"): Change("operator", lambda w: {
        "minutes": "30", "comment": "restarting it"}, "silence.create"),
    ("alerts/silences/{pk}/expire/", "post"): Change("operator", _none, "silence.expire"),
    ("alerts/notifiers/new/", "post"): Change("admin", lambda w: {
        "team": str(w.alpha.pk), "name": "pager2", "kind": "webhook", "enabled": "on",
        "url": "https://hooks.example.com/p2", "recipients": "[]", "send_resolved": "on",
        "min_severity": "info", "timeout_s": "5", "max_attempts": "5"}, "notifier.create"),
    ("alerts/notifiers/{pk}/delete/", "post"): Change("admin", _none, "notifier.delete"),
    # revisions and rollouts
    ("api/v1/deployments/{pk}/revisions/", "post"): Change("operator", lambda w: {
        "block_size": 32, "note": "bigger blocks"}, "revision.create"),
    ("deployments/{name}/revisions/new/", "post"): Change("operator", lambda w: {
        "block_size": "32", "note": "bigger blocks"}, "revision.create"),
    ("api/v1/rollouts/", "post"): Change("operator", lambda w: {
        "deployment": w.deployment.name, "revision": w.revision.number,
        "strategy": "blue_green"}, "rollout.starting"),
    ("deployments/{name}/revisions/{number}/rollout/", "post"): Change(
        "operator", lambda w: {"strategy": "canary"}, "rollout.starting"),
    ("api/v1/deployments/{pk}/rollback/", "post"): Change("operator", _none, "rollout.starting"),
    ("deployments/{name}/rollback/", "post"): Change("operator", _none, "rollout.starting"),
    # the topology advice
    ("api/v1/deployments/{pk}/advice/measure/", "post"): Change("operator", _none,
                                                                "advisor.measure"),
    ("deployments/{name}/topology/measure/", "post"): Change("operator", _none, "advisor.measure"),
    ("api/v1/deployments/{pk}/advice/apply/", "post"): Change(
        "operator", lambda w: dict(ADVISED_LOAD), "revision.create", also=("rollout.starting",)),
    ("deployments/{name}/topology/apply/", "post"): Change(
        "operator", lambda w: dict(ADVISED_LOAD), "revision.create", also=("rollout.starting",)),
    ("api/v1/rollouts/{pk}/pause/", "post"): Change("operator", _none, "rollout.paused"),
    ("rollouts/{pk}/pause/", "post"): Change("operator", _none, "rollout.paused"),
    ("api/v1/rollouts/{pk}/resume/", "post"): Change("operator", _none, "rollout.stepping"),
    ("rollouts/{pk}/resume/", "post"): Change("operator", _none, "rollout.stepping"),
    ("api/v1/rollouts/{pk}/promote/", "post"): Change("operator", _none, "rollout.stepping"),
    ("rollouts/{pk}/promote/", "post"): Change("operator", _none, "rollout.stepping"),
    ("api/v1/rollouts/{pk}/rollback/", "post"): Change("operator", _none,
                                                       "rollout.rolling_back"),
    ("rollouts/{pk}/rollback/", "post"): Change("operator", _none, "rollout.rolling_back"),
    # autoscaling over the API
    ("api/v1/deployments/{pk}/autoscaling/{role}/", "put"): Change(
        "operator", lambda w: {"signal": "queue"}, "autoscaling.policy.create"),
    ("api/v1/deployments/{pk}/autoscaling/{role}/", "patch"): Change(
        "operator", lambda w: {"mode": "active"}, "autoscaling.policy.update"),
    ("api/v1/deployments/{pk}/autoscaling/{role}/", "delete"): Change(
        "operator", _none, "autoscaling.policy.delete"),
    ("api/v1/deployments/{pk}/autoscaling/ratio-band/", "put"): Change(
        "operator", lambda w: {"min_ratio": 0.5, "max_ratio": 2}, "autoscaling.ratio_band.update"),
    ("api/v1/deployments/{pk}/autoscaling/ratio-band/", "delete"): Change(
        "operator", _none, "autoscaling.ratio_band.delete"),
    ("api/v1/deployments/{pk}/autoscaling/ratio-band/from-advice/", "post"): Change(
        "operator", lambda w: dict(ADVISED_LOAD), "autoscaling.ratio_band.update"),
    # autoscaling pages (a new policy's entry: tests/console/test_autoscaling_pages.py)
    ("deployments/{name}/autoscaling/{role}/", "post"): Change(
        "operator", _policy_form, "autoscaling.policy.update"),
    ("deployments/{name}/autoscaling/{role}/mode/", "post"): Change(
        "operator", lambda w: {"mode": "active"}, "autoscaling.policy.update"),
    # the caller's own API tokens
    ("api/v1/tokens/", "post"): Change("viewer", lambda w: {"name": "script"}, "api_token.create"),
    ("api/v1/tokens/{pk}/revoke/", "post"): Change("viewer", _none, "api_token.revoke"),
    ("tokens/new/", "post"): Change("viewer", lambda w: {"name": "script2",
                                                         "expires_in_days": "30"},
                                    "api_token.create"),
    ("tokens/{pk}/revoke/", "post"): Change("viewer", _none, "api_token.revoke"),
}

# Answered, but nothing is changed: said here, with why.
READS: dict[tuple[str, str], str] = {
    ("api/v1/deployments/{pk}/check/", "post"): "the checks of a plan, saved or as a body "
                                                 "would change it; nothing is saved",
    ("deployments/new/check/", "post"): "the form's live check panel; nothing is saved",
    ("deployments/{name}/edit/check/", "post"): "the form's live check panel; nothing is saved",
    ("deployments/new/propose/", "post"): "free ports and devices for a form row",
    ("deployments/{name}/edit/propose/", "post"): "free ports and devices for a form row",
    ("api/v1/deployments/{pk}/chat/", "post"): "inference through the router; the router "
                                               "logs requests, the audit log changes",
    ("api/v1/alert-rules/preview/", "post"): "a rule evaluated over the stored metrics; "
                                             "nothing is saved",
    ("alerts/rules/preview/", "post"): "the rule form's preview over the stored metrics; "
                                       "nothing is saved",
}

def _spare_model(w: World) -> None:
    w.base_model = BaseModel.objects.create(name="spare")


def _spare_variant(w: World) -> None:
    w.variant = register(w.base_model, Path(w.spare_dir).parent, "spare-variant")


def _spare_node(w: World) -> None:
    w.node = Node.objects.create(name="spare", address="10.0.0.7", cpu_ids=[0, 1],
                                 memory_bytes=1 << 34, engine_version="0.32.0")


def _spare_team(w: World) -> None:
    w.alpha = Team.objects.create(name="spare")


def _queued_job(w: World) -> None:
    QuantizationJob.objects.filter(pk=w.job.pk).update(state=QuantizationJob.State.QUEUED)


def _running(w: World) -> None:
    Deployment.objects.filter(pk=w.deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)


def _stopped(w: World) -> None:
    ManagedProcess.objects.filter(deployment=w.deployment).update(
        state=ManagedProcess.State.STOPPED)


def _rollout_done(w: World) -> None:
    """The world's rollout finished and the deployment running: a new one may start."""
    _running(w)
    Rollout.objects.filter(pk=w.rollout.pk).update(state=Rollout.State.ROLLED_BACK)


def _live_replaced(w: World) -> None:
    """A revision before the live one to roll back to: the live one retired, the plan as it is
    live again under the next number."""
    _rollout_done(w)
    live = Revision.objects.get(deployment=w.deployment, state=Revision.State.LIVE)
    Revision.objects.filter(pk=live.pk).update(state=Revision.State.RETIRED)
    Revision.objects.create(deployment=w.deployment, number=w.revision.number + 1,
                            spec=live.spec, state=Revision.State.LIVE)


# A load the stored speeds below advise colocated for, over the world's PD plan.
ADVISED_LOAD = {"rate_per_s": "14", "prompt_tokens": "32", "output_tokens": "32"}


def _advisable(w: World) -> None:
    """Speeds of the plan's variant stored on two devices, under SLOs that make ADVISED_LOAD
    recommend another topology; the deployment running and free of rollouts."""
    _rollout_done(w)
    Deployment.objects.filter(pk=w.deployment.pk).update(ttft_slo_ms=1500, tpot_slo_ms=60)
    worker = w.deployment.workers.get(role="decode")
    Node.objects.filter(pk=worker.node_id).update(cpu_ids=[0, 1])
    SpeedProfile.objects.create(node=worker.node, variant=worker.variant,
                                state=SpeedProfile.State.DONE, speeds=ADVISED_SPEEDS)


def _paused(w: World) -> None:
    Rollout.objects.filter(pk=w.rollout.pk).update(state=Rollout.State.PAUSED,
                                                   paused_from=Rollout.State.STEPPING)


def _scaled(w: World) -> None:
    """A policy of the world's decode pool to change (get: the world may have one already)."""
    PoolPolicy.objects.get_or_create(deployment=w.deployment, role="decode", defaults={
        "signal": "queue", "scale_up_at": 2.0, "scale_down_at": 0.5})


def _banded(w: World) -> None:
    """A ratio band of the world's (PD) deployment to remove."""
    RatioBand.objects.get_or_create(deployment=w.deployment, defaults={"min_ratio": 0.5,
                                                                       "max_ratio": 2.0})


def _team_budget(w: World) -> None:
    TeamBudget.objects.create(team=w.alpha, tokens=500, period="month")


def _inactive_viewer(w: World) -> None:
    type(w.viewer).objects.filter(pk=w.viewer.pk).update(is_active=False)


# What a fresh world refuses (an object still in use, a job already done), made possible first:
# the refusal itself is tested where the endpoint is.
PREPARE: dict[tuple[str, str], Callable[[World], None]] = {
    ("api/v1/models/{pk}/", "delete"): _spare_model,
    ("api/v1/variants/{pk}/", "delete"): _spare_variant,
    ("api/v1/nodes/{pk}/", "put"): _spare_node,
    ("api/v1/nodes/{pk}/", "patch"): _spare_node,
    ("api/v1/nodes/{pk}/", "delete"): _spare_node,
    ("nodes/{pk}/delete/", "post"): _spare_node,
    ("api/v1/teams/{pk}/", "delete"): _spare_team,
    ("teams/{name}/delete/", "post"): _spare_team,
    ("api/v1/quantization-jobs/{pk}/cancel/", "post"): _queued_job,
    ("models/jobs/{pk}/cancel/", "post"): _queued_job,
    ("users/{pk}/activate/", "post"): _inactive_viewer,
    ("api/v1/team-budgets/{name}/", "patch"): _team_budget,
    ("api/v1/team-budgets/{name}/", "delete"): _team_budget,
    ("api/v1/deployments/{pk}/gate/", "post"): _running,
    ("api/v1/deployments/{pk}/verifications/", "post"): _running,
    ("deployments/{name}/verify/", "post"): _running,
    ("deployments/{name}/gate/run/", "post"): _running,
    ("api/v1/deployments/{pk}/", "delete"): _stopped,
    ("api/v1/rollouts/", "post"): _rollout_done,
    ("deployments/{name}/revisions/{number}/rollout/", "post"): _rollout_done,
    ("api/v1/deployments/{pk}/rollback/", "post"): _live_replaced,
    ("deployments/{name}/rollback/", "post"): _live_replaced,
    ("api/v1/rollouts/{pk}/resume/", "post"): _paused,
    ("api/v1/deployments/{pk}/advice/apply/", "post"): _advisable,
    ("deployments/{name}/topology/apply/", "post"): _advisable,
    ("rollouts/{pk}/resume/", "post"): _paused,
    ("api/v1/deployments/{pk}/autoscaling/{role}/", "patch"): _scaled,
    ("api/v1/deployments/{pk}/autoscaling/{role}/", "delete"): _scaled,
    ("api/v1/deployments/{pk}/autoscaling/ratio-band/", "delete"): _banded,
    ("api/v1/deployments/{pk}/autoscaling/ratio-band/from-advice/", "post"): _advisable,
    ("deployments/{name}/autoscaling/{role}/", "post"): _scaled,
    ("deployments/{name}/autoscaling/{role}/mode/", "post"): _scaled,
}


def _send(client: Client, method: str, url: str, body: dict[str, Any]) -> tuple[int, str]:
    if is_api(url.lstrip("/")):
        response = getattr(client, method)(url, data=body, content_type="application/json")
    else:
        response = getattr(client, method)(url, data=body)
    return response.status_code, response.content.decode(errors="replace")[:600]


PATHS = [t for t in KINDS if KINDS[t] != PUBLIC]


@pytest.mark.parametrize("template", PATHS)
def test_every_answered_change_is_listed(world: World, template: str) -> None:
    url = fill(template, values(world, template))
    client = client_for(world, "root", template)
    answered = [m for m in UNSAFE if call(client, m, url) != 405]
    unlisted = [m for m in answered
                if (template, m) not in CHANGES and (template, m) not in READS]
    assert not unlisted, (f"{template}: {unlisted} answer; list each in CHANGES (with a request "
                          f"that succeeds) or READS (with why it changes nothing)")


@pytest.mark.parametrize(("template", "method"), sorted(CHANGES))
def test_each_change_writes_one_entry_naming_the_user(world: World, template: str,
                                                      method: str) -> None:
    change = CHANGES[(template, method)]
    prepare = PREPARE.get((template, method))
    if prepare is not None:
        prepare(world)
    url = fill(template, values(world, template))
    client = client_for(world, change.who, template)
    before = AuditEntry.objects.count()
    status, text = _send(client, method, url, change.body(world))
    assert status < 400, f"{method.upper()} {url} as {change.who}: {status} {text}"
    entries = list(AuditEntry.objects.order_by("pk")[before:])
    assert [e.action for e in entries] == [change.action, *change.also], f"{method.upper()} {url}"
    entry = entries[0]
    assert entry.username == world.user(change.who).username
    assert entry.actor in (AuditEntry.Actor.USER, AuditEntry.Actor.TOKEN)
    if is_api(template):
        assert entry.actor == AuditEntry.Actor.TOKEN and entry.via


def test_listed_changes_exist() -> None:
    gone = sorted({t for t, _m in [*CHANGES, *READS]} - set(KINDS))
    assert not gone, f"CHANGES/READS name paths that no longer exist: {gone}"
    assert Deployment  # the plan bodies name the deployments app's fields
