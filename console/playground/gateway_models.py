"""The models of the gateway a user may pick in the playground: each visible deployment's served
name, and each visible alias, resolved as the gateway resolves it (its first target that
serves, else its first target)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from console.accounts.roles import visible
from console.deployments.models import Deployment
from console.gateway.models import ModelAlias
from console.gateway.routes_config import states


@dataclass(frozen=True)
class PickableModel:
    name: str
    deployment: Deployment
    alias: bool
    state: str


def gateway_models(user: AbstractBaseUser | AnonymousUser) -> list[PickableModel]:
    deployments = list(visible(Deployment.objects.select_related("team").order_by("name"), user))
    state_of = states(deployments)
    by_pk = {d.pk: d for d in deployments}
    models = [PickableModel(d.served_model_name, d, False, state_of[d.name]) for d in deployments]
    for alias in visible(ModelAlias.objects.prefetch_related("targets"), user):
        targets = [by_pk[t.deployment_id] for t in sorted(alias.targets.all(),
                                                          key=lambda t: t.position)
                   if t.deployment_id in by_pk]
        if not targets:
            continue
        serving = [d for d in targets if state_of[d.name] == "running"]
        chosen = (serving or targets)[0]
        models.append(PickableModel(alias.name, chosen, True, state_of[chosen.name]))
    return models
