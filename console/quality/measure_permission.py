"""Who may measure a variant. A variant is shared (the catalog is every team's), but measuring
one starts vLLM servers on a node, so it is an operator's: a superuser, or an operator of a team
with a deployment of the variant's base model. Of the base model, not of the variant itself: the
advice table of a deployment offers to measure every variant of its model, and finding out
whether to switch to one it does not use yet is what a measurement is for."""

from __future__ import annotations

from console.accounts.models import Role
from console.accounts.roles import User, is_superuser, may
from console.catalog.models import Variant
from console.deployments.models import Deployment


def may_measure(user: User, variant: Variant) -> bool:
    if is_superuser(user):
        return True
    teams = set(Deployment.objects.filter(base_model=variant.base_id)
                .values_list("team_id", flat=True))
    return any(may(user, team, Role.OPERATOR) for team in teams)
