"""Token budgets in the console: what each key and team spent in its current period, from the
stored usage (``UsageDay``, read from the routers' ledgers every sync round), and the budgets as
the routers are told them with the key set (``spent`` over every deployment and ``spent_here``,
the part from the deployment's own ledger). inference/router/budgets.py says why the routers
enforce them from this push, and what that lets through."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from django.db.models import F, Sum

from console.gateway.models import ApiKey, TeamBudget, UsageDay
from inference.router.budgets import Period, periods


def current_periods(now: datetime | None = None) -> dict[str, Period]:
    """The UTC day and calendar month ``now`` (default: now) falls in, by period name."""
    day, month = periods((now or datetime.now(UTC)).timestamp())
    return {"day": day, "month": month}


def renews_at(period: Period) -> datetime:
    return datetime.fromtimestamp(period.renews_at, tz=UTC)


@dataclass
class Spend:
    """Tokens spent in each budget's current period, per deployment name."""

    periods: dict[str, Period]
    keys: dict[int, dict[str, int]] = field(default_factory=dict)
    teams: dict[int, dict[str, int]] = field(default_factory=dict)

    def key(self, pk: int) -> int:
        return sum(self.keys.get(pk, {}).values())

    def team(self, pk: int) -> int:
        return sum(self.teams.get(pk, {}).values())


def _sums(rows: Any, owner: str, wanted: dict[int, str], spend: Spend,
          into: dict[int, dict[str, int]]) -> None:
    today = date.fromisoformat(spend.periods["day"].start)
    per_owner = (rows.values(owner, "day", "deployment_name")
                 .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
                 .order_by())
    for row in per_owner:
        if wanted[row[owner]] == "day" and row["day"] != today:
            continue
        by_deployment = into.setdefault(row[owner], defaultdict(int))
        by_deployment[row["deployment_name"]] += row["tokens"] or 0


def spend(keys: Collection[ApiKey] = (), teams: Collection[TeamBudget] = (),
          now: datetime | None = None) -> Spend:
    """What ``keys`` (those with a budget) and the teams of ``teams`` spent in their periods:
    one query each, over the month's stored rows."""
    result = Spend(current_periods(now))
    month_start = date.fromisoformat(result.periods["month"].start)
    key_periods = {key.pk: key.budget_period for key in keys if key.budget_tokens is not None}
    if key_periods:
        _sums(UsageDay.objects.filter(day__gte=month_start, key_id__in=key_periods), "key_id",
              key_periods, result, result.keys)
    team_periods = {budget.team_id: budget.period for budget in teams}
    if team_periods:
        # A team's budget covers its keys: requests without a key are of no key to refuse.
        _sums(UsageDay.objects.filter(day__gte=month_start, team_id__in=team_periods,
                                      key__isnull=False), "team_id", team_periods, result,
              result.teams)
    return result


def pushed(tokens: int, period: str, spent: dict[str, int], deployment: str,
           spend_of: Spend) -> dict[str, Any]:
    """A budget as a router is told it (inference/router/budgets.py)."""
    return {"tokens": tokens, "period": period, "period_start": spend_of.periods[period].start,
            "spent": sum(spent.values()), "spent_here": spent.get(deployment, 0)}
