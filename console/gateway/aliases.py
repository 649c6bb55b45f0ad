"""Model aliases at the gateway: make, change and remove them, each change audited and pushed
to the gateway once committed.

An alias names deployments of its own team, in fallback order. Its name is a model name of the
gateway's one namespace: it may not be a deployment's served name (the served name would win,
and the alias would never be used) nor another alias.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from console.accounts.models import Team
from console.audit.entries import record
from console.deployments.models import Deployment
from console.gateway.models import MODEL_NAME, AliasTarget, ModelAlias
from console.gateway.services import gateway_changed

MAX_TARGETS = 8


def _state(alias: ModelAlias) -> dict[str, Any]:
    return {"name": alias.name, "team": alias.team_id, "targets": alias.target_names()}


def validate(name: str, team: Team, targets: Sequence[Deployment],
             alias: ModelAlias | None = None) -> None:
    """Raises ValidationError naming the field."""
    errors: dict[str, str] = {}
    if not MODEL_NAME.fullmatch(name):
        errors["name"] = ("letters, digits and . _ : / - only, starting with a letter or digit, "
                          "up to 100 characters")
    elif Deployment.objects.filter(served_model_name=name).exists():
        errors["name"] = f"'{name}' is a deployment's served model name already"
    elif ModelAlias.objects.filter(name=name).exclude(pk=getattr(alias, "pk", None)).exists():
        errors["name"] = f"an alias named '{name}' exists already"
    if not targets:
        errors["targets"] = "name at least one deployment"
    elif len(targets) > MAX_TARGETS:
        errors["targets"] = f"at most {MAX_TARGETS} deployments"
    elif len({t.pk for t in targets}) != len(targets):
        errors["targets"] = "a deployment may appear once"
    else:
        foreign = sorted(t.name for t in targets if t.team_id != team.pk)
        if foreign:
            errors["targets"] = f"not of team {team.name}: {', '.join(foreign)}"
    if errors:
        raise ValidationError(errors)


def _set_targets(alias: ModelAlias, targets: Sequence[Deployment]) -> None:
    alias.targets.all().delete()
    AliasTarget.objects.bulk_create(AliasTarget(alias=alias, deployment=deployment, position=n)
                                    for n, deployment in enumerate(targets))


@transaction.atomic
def create_alias(*, name: str, team: Team, targets: Sequence[Deployment],
                 user: AbstractBaseUser | None) -> ModelAlias:
    validate(name, team, targets)
    alias = ModelAlias.objects.create(
        name=name, team=team,
        created_by=user if user is not None and user.is_authenticated else None)
    _set_targets(alias, targets)
    record("alias.create", alias, after=_state(alias))
    gateway_changed()
    return alias


@transaction.atomic
def update_alias(alias: ModelAlias, *, name: str | None = None,
                 targets: Sequence[Deployment] | None = None) -> ModelAlias:
    before = _state(alias)
    new_name = alias.name if name is None else name
    new_targets = list(alias.targets.select_related("deployment")) if targets is None else None
    validate(new_name, alias.team,
             [t.deployment for t in new_targets] if new_targets is not None else targets or [],
             alias)
    alias.name = new_name
    alias.save(update_fields=["name"])
    if targets is not None:
        _set_targets(alias, targets)
    record("alias.edit", alias, before=before, after=_state(alias))
    gateway_changed()
    return alias


@transaction.atomic
def delete_alias(alias: ModelAlias) -> None:
    before = _state(alias)
    record("alias.delete", alias, before=before, after={})
    alias.delete()
    gateway_changed()
