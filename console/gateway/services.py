"""API keys: create (the secret returned once), update, revoke, and the key set each
deployment's router receives (hashes, states, limits, per-model limits, budgets with what they
spent; never a secret). Team budgets: set and cleared."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.accounts.models import Team
from console.audit.entries import record, snapshot
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.budgets import Spend, pushed, spend
from console.gateway.models import LIMIT_FIELDS, MODEL_NAME, ApiKey, TeamBudget
from console.gateway.private_files import write_private
from console.gateway.router_admin import console_key, push_keys
from console.gateway.routes_config import gateway_config, in_scope
from inference.router.keys import CONSOLE_KEY_ID, key_hash, new_key, public_prefix

# What the audit log shows of a key: never its hash.
KEY_FIELDS = ("name", "team", "all_deployments", "deployments", *LIMIT_FIELDS, "model_limits",
              "budget_tokens", "budget_period", "priority", "priority_header", "revoked_at")
# What a key is made with besides its name, team and scope (API and form alike).
KEY_SETTINGS = (*LIMIT_FIELDS, "model_limits", "budget_tokens", "budget_period", "priority",
                "priority_header")
MAX_LIMIT = 1_000_000_000
TEAM_BUDGET_FIELDS = ("tokens", "period")


def clean_model_limits(value: Any, team: Team) -> dict[str, dict[str, int | None]]:
    """``value`` as a key's per-model limits: an object of served model names (served by a
    deployment of ``team``: a misspelt name would limit nothing), each an object of limits by
    name, each a positive integer or null (unlimited on that model). ValidationError saying
    which model and limit is wrong."""
    if not isinstance(value, dict):
        raise ValidationError('expected an object such as {"big": {"requests_per_minute": 5}}')
    served = set(Deployment.objects.filter(team=team).values_list("served_model_name",
                                                                  flat=True))
    cleaned: dict[str, dict[str, int | None]] = {}
    for model, limits in value.items():
        if not MODEL_NAME.fullmatch(model):
            raise ValidationError(f"{model!r} is not a model name")
        if model not in served:
            raise ValidationError(f"no deployment of team {team.name} serves model {model!r}")
        if not isinstance(limits, dict) or not limits:
            raise ValidationError(f"{model}: expected an object of limits, one or more of "
                                  f"{', '.join(LIMIT_FIELDS)}")
        for name, limit in limits.items():
            if name not in LIMIT_FIELDS:
                raise ValidationError(f"{model}: {name!r} is not a limit (one of "
                                      f"{', '.join(LIMIT_FIELDS)})")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                      or not 1 <= limit <= MAX_LIMIT):
                raise ValidationError(f"{model}.{name}: expected an integer from 1 to "
                                      f"{MAX_LIMIT}, or null for unlimited on this model")
        cleaned[model] = dict(limits)
    return cleaned


def scope_errors(team: Team, deployments: Iterable[Deployment]) -> dict[str, str]:
    """A key opens only deployments of its own team."""
    foreign = sorted(d.name for d in deployments if d.team_id != team.pk)
    if foreign:
        return {"deployments": f"not of team {team.name}: {', '.join(foreign)}"}
    return {}


def create_key(*, name: str, team: Team, deployments: Iterable[Deployment], all_deployments: bool,
               limits: dict[str, Any], user: AbstractBaseUser | None) -> tuple[ApiKey, str]:
    """A new key and its secret, which is not stored and cannot be shown again. ``limits``: the
    fields of KEY_SETTINGS given (limits, per-model limits, budget)."""
    deployments = list(deployments)
    for _attempt in range(5):
        secret = new_key()
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    name=name, team=team, prefix=public_prefix(secret), key_hash=key_hash(secret),
                    all_deployments=all_deployments,
                    created_by=user if user is not None and user.is_authenticated else None,
                    **{field: limits[field] for field in KEY_SETTINGS
                       if limits.get(field) is not None})
                key.deployments.set(deployments)
                record("key.create", key, after=snapshot(key, KEY_FIELDS))
        except IntegrityError:
            continue  # a prefix already taken (1 in 4 billion per key): draw again
        keys_changed()
        return key, secret
    raise RuntimeError("could not draw an unused key prefix")


@transaction.atomic
def update_key(key: ApiKey, changes: dict[str, Any]) -> ApiKey:
    before = snapshot(key, KEY_FIELDS)
    deployments = changes.pop("deployments", None)
    for name, value in changes.items():
        setattr(key, name, value)
    key.save()
    if deployments is not None:
        key.deployments.set(list(deployments))
    record("key.edit", key, before=before, after=snapshot(key, KEY_FIELDS))
    keys_changed()
    return key


@transaction.atomic
def revoke_key(key: ApiKey) -> ApiKey:
    """Revoked from the next request on; revoking twice keeps the first time."""
    before = snapshot(key, ("revoked_at",))
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        keys_changed()
    record("key.revoke", key, before=before, after=snapshot(key, ("revoked_at",)))
    return key


@transaction.atomic
def set_team_budget(team: Team, tokens: int, period: str) -> TeamBudget:
    budget = TeamBudget.objects.filter(team=team).first()
    before = snapshot(budget, TEAM_BUDGET_FIELDS) if budget is not None else None
    if budget is None:
        budget = TeamBudget(team=team)
    budget.tokens, budget.period = tokens, period
    budget.save()
    record("team_budget.edit", budget, before=before,
           after=snapshot(budget, TEAM_BUDGET_FIELDS), team_id=team.pk)
    keys_changed()
    return budget


@transaction.atomic
def clear_team_budget(budget: TeamBudget) -> None:
    record("team_budget.delete", budget, before=snapshot(budget, TEAM_BUDGET_FIELDS),
           team_id=budget.team_id)
    budget.delete()
    keys_changed()


def keys_changed() -> None:
    """Once the change is committed: rewrite every deployment's key file (read by a router at
    start) and push the new sets to the routers running now."""
    transaction.on_commit(_publish)


def _publish() -> None:
    keys, budgets = _budgeted()
    spent = spend(keys, budgets)
    for deployment in Deployment.objects.all():
        body = key_set(deployment, spent)
        write_private(keys_file_path(deployment), json.dumps(body))
        push_keys(deployment, body)
    publish_gateway_config()


def gateway_changed() -> None:
    """Once the change (an alias, a key) is committed: tell the gateway now rather than at the
    sync's next round."""
    transaction.on_commit(publish_gateway_config)


def publish_gateway_config() -> None:
    if not gateway_process.enabled():
        return
    config = gateway_config()
    gateway_process.write_config(config)
    gateway_process.push_config_everywhere(config)


def _budgeted() -> tuple[list[ApiKey], list[TeamBudget]]:
    return (list(ApiKey.objects.filter(budget_tokens__isnull=False, revoked_at__isnull=True)),
            list(TeamBudget.objects.all()))


def key_set(deployment: Deployment, spent: Spend | None = None) -> dict[str, Any]:
    """What ``deployment``'s router is told (see inference/router/keys.py); ``spent``: the
    budgets' spend if already counted (else counted here).

    Keys of other deployments are listed as out of scope so that the router can say why it
    refuses them. A key is required as soon as any key, even a revoked one, was made for this
    deployment: revoking a leaked last key must not open the router. The budgets' spend is
    part of the set, so a router whose spend is behind has another version and gets the set
    again at the key sync's next round.
    """
    keys = list(ApiKey.objects.prefetch_related("deployments").order_by("pk"))
    team_budgets = list(TeamBudget.objects.all())
    if spent is None:
        spent = spend([key for key in keys if key.budget_tokens is not None and not key.revoked],
                      team_budgets)
    entries = []
    for key in keys:
        scoped = in_scope(key, deployment)
        state = "revoked" if key.revoked else "active" if scoped else "out_of_scope"
        entry: dict[str, Any] = {"id": key.pk, "prefix": key.prefix, "hash": key.key_hash,
                                 "state": state, "limits": key.limits(), "team": key.team_id}
        if key.model_limits:
            entry["model_limits"] = key.model_limits
        if key.budget_tokens is not None and state == "active":
            entry["budget"] = pushed(key.budget_tokens, key.budget_period,
                                     spent.keys.get(key.pk, {}), deployment.name, spent)
        entries.append(entry)
    own = console_key(deployment)
    # The console's own key (the playground's), derived from the secret key, never stored.
    entries.append({"id": CONSOLE_KEY_ID, "prefix": public_prefix(own), "hash": key_hash(own),
                    "state": "active", "limits": {}})
    teams = {str(budget.team_id): pushed(budget.tokens, budget.period,
                                         spent.teams.get(budget.team_id, {}), deployment.name,
                                         spent)
             for budget in team_budgets}
    body = {"require_key": any(in_scope(key, deployment) for key in keys), "keys": entries,
            "teams": teams}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": digest, **body}


def keys_file_path(deployment: Deployment) -> Path:
    return Path(settings.DATA_DIR) / "keys" / f"{deployment.name}.json"


def write_keys_file(deployment: Deployment) -> Path:
    """Write the key set where the router reads it at start."""
    return write_private(keys_file_path(deployment), json.dumps(key_set(deployment)))


def record_usage(usage: dict[str, Any]) -> int:
    """Store the routers' last-use times (``GET /admin/keys/usage``). Returns keys updated."""
    updated = 0
    for key_id, counts in (usage.get("keys") or {}).items():
        last_used = counts.get("last_used") if isinstance(counts, dict) else None
        if not str(key_id).isdigit() or not isinstance(last_used, (int, float)):
            continue
        when = datetime.fromtimestamp(last_used, tz=timezone.get_current_timezone())
        # Only forward in time: several routers (and replicas) report the same key.
        updated += ApiKey.objects.filter(pk=int(key_id)).exclude(last_used_at__gte=when).update(
            last_used_at=when)
    return updated
