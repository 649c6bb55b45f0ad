"""Token budgets: a key's, and its team's, prompt + completion tokens per UTC day or calendar month
(UTC), the same tokens the usage ledger meters (usage.py). Once a budget is spent the router
answers 429 ``budget_exceeded`` with ``Retry-After`` until the period renews.

How a router knows what was spent on every deployment: it does not ask anyone per request. The
console holds the spend: every few seconds its key sync reads each router's ledger into
``UsageDay`` rows, and it pushes, with the key set, each budget's ``spent`` (the period's tokens
over every deployment, as stored) and ``spent_here`` (the part of it that came from this
router's ledger). The router keeps its own ledger's totals for the current day and month in
memory (loaded from ``--usage-file`` at start, added to as each request is metered), so what it
holds beyond what the console has seen of it is ``own - spent_here``, and its estimate of the
spend is ``spent + max(0, own - spent_here)``. A push from any source (a key edit, the sync) is
therefore right whenever it lands, and a router restarted on its ledger file starts where it
left off. The router that serves a key's traffic refuses as soon as its own count crosses the
line; the others follow within one sync round (5 s), once the console has read that router's
ledger and pushed the new spend to them. This is eventual consistency bounded by the sync
interval, as LiteLLM's spend tracking is (its proxy checks a spend that a batch writer updates
every few seconds).

What it lets through, by design:
- requests admitted while the budget was not yet spent run to their end, however much they
  generate (a budget is checked when a request arrives, not per token);
- on the other deployments, what the key spends there during the sync interval before the
  console pushes the spend that crosses the line;
- a push whose period has ended (the console has not synced since the period renewed) counts
  for nothing: the router then counts only its own tokens until the console pushes the new
  period's spend.

Why no shared counter in Redis: the hot path stays a dictionary lookup and a comparison, with
no extra round trip per request; the limits that must hold to the request (rates,
concurrency) are in ratelimit.py, and a budget spans days or a month, where seconds of delay
matter little.
"""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from inference.router.errors import RequestError

PERIODS = ("day", "month")
PERIOD_WORDS = {"day": "daily", "month": "monthly"}
DAY_S = 86400
DAY_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class Budget:
    """A budget as the console pushes it; its spend holds for the period that began on
    ``period_start`` (a UTC day, YYYY-MM-DD) and for no other."""

    tokens: int
    period: str
    period_start: str = ""
    spent: int = 0       # the period's tokens over every deployment, as the console stored them
    spent_here: int = 0  # the part of ``spent`` read from this router's ledger


def _count(data: dict[str, Any], name: str, where: str, minimum: int) -> int:
    value = data.get(name, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RequestError(400, f"'{where}.{name}' must be an integer >= {minimum}",
                           param=f"{where}.{name}")
    return value


def parse_budget(data: Any, where: str) -> Budget:
    """A budget of the key set (see keys.py); RequestError naming the offending field."""
    if not isinstance(data, dict):
        raise RequestError(400, f"'{where}' must be an object", param=where)
    if "tokens" not in data:
        raise RequestError(400, f"'{where}.tokens' is missing", param=f"{where}.tokens")
    period = data.get("period")
    if period not in PERIODS:
        raise RequestError(400, f"'{where}.period' must be one of {', '.join(PERIODS)}",
                           param=f"{where}.period")
    start = data.get("period_start", "")
    if not isinstance(start, str) or (start and not DAY_PATTERN.fullmatch(start)):
        raise RequestError(400, f"'{where}.period_start' must be a day as YYYY-MM-DD",
                           param=f"{where}.period_start")
    return Budget(_count(data, "tokens", where, 1), period, start,
                  _count(data, "spent", where, 0), _count(data, "spent_here", where, 0))


@dataclass(frozen=True)
class Period:
    start: str       # its first UTC day, YYYY-MM-DD
    renews_at: float  # Unix time of the next period's start


def periods(now: float) -> tuple[Period, Period]:
    """The UTC day and the UTC calendar month ``now`` falls in."""
    day = int(now // DAY_S)
    today = time.gmtime(day * DAY_S)
    year, month = today.tm_year, today.tm_mon
    next_year, next_month = (year + 1, 1) if month == 12 else (year, month + 1)
    return (Period(time.strftime("%Y-%m-%d", today), (day + 1) * DAY_S),
            Period(f"{year:04d}-{month:02d}-01",
                   float(calendar.timegm((next_year, next_month, 1, 0, 0, 0)))))


class BudgetExceeded(Exception):
    """A budget is spent: ``scope`` is ``key`` or ``team``; ``retry_after_s`` lasts until the
    period renews."""

    def __init__(self, scope: str, budget: Budget, renews_at: float, now: float):
        self.scope = scope
        self.period = budget.period
        self.retry_after_s = max(1, math.ceil(renews_at - now))
        renewal = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(renews_at))
        self.message = (f"the {scope}'s {PERIOD_WORDS[budget.period]} token budget of "
                        f"{budget.tokens} tokens is spent; it renews at {renewal}")
        super().__init__(self.message)

    @property
    def param(self) -> str:
        return f"{self.scope}_budget"


class BudgetedKey(Protocol):
    """What the meter reads of a key (an ApiKey of keys.py): a protocol, so that keys.py, which
    parses budgets, and this module do not import each other."""

    @property
    def id(self) -> str: ...
    @property
    def team(self) -> str: ...
    @property
    def budget(self) -> Budget | None: ...
    @property
    def team_budget(self) -> Budget | None: ...


class BudgetedKeys(Protocol):
    @property
    def keys(self) -> Sequence[BudgetedKey]: ...


class BudgetMeter:
    """This router's tokens per key and per team in the current UTC day and month, and the check
    of the budgets against them plus what the console pushed. Single-threaded asyncio."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._day_number = -1
        self._day = Period("", 0.0)
        self._month = Period("", 0.0)
        # id -> [tokens today, tokens this month], of this router's ledger
        self._keys: dict[str, list[int]] = {}
        self._teams: dict[str, list[int]] = {}
        self._team_of: dict[str, str] = {}

    # ---- the periods --------------------------------------------------------------------
    def _roll(self, now: float) -> None:
        number = int(now // DAY_S)
        if number == self._day_number:
            return
        self._day_number = number
        day, month = periods(now)
        new_month = month.start != self._month.start
        self._day, self._month = day, month
        for counts in (*self._keys.values(), *self._teams.values()):
            counts[0] = 0
            if new_month:
                counts[1] = 0

    def month_start(self) -> str:
        """The first day of the current month: the ledger's days to load from."""
        self._roll(self.clock())
        return self._month.start

    # ---- what this router counts --------------------------------------------------------
    def load(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """This router's ledger totals as (day, key id, tokens), days of the current month."""
        self._roll(self.clock())
        for day, key_id, tokens in rows:
            if day < self._month.start:
                continue
            counts = self._keys.setdefault(key_id, [0, 0])
            counts[1] += tokens
            if day == self._day.start:
                counts[0] += tokens
        self._sum_teams()

    def keys_changed(self, key_set: BudgetedKeys) -> None:
        """Follow a new key set's teams (a key's team never changes, but keys come and go)."""
        self._team_of = {key.id: key.team for key in key_set.keys if key.team}
        self._sum_teams()

    def _sum_teams(self) -> None:
        teams: dict[str, list[int]] = {}
        for key_id, counts in self._keys.items():
            team = self._team_of.get(key_id)
            if team:
                total = teams.setdefault(team, [0, 0])
                total[0] += counts[0]
                total[1] += counts[1]
        self._teams = teams

    def record(self, key: BudgetedKey, tokens: int) -> None:
        """Count the tokens of one metered request, as the ledger does."""
        # hot path: runs once per request; a few dict operations
        if not tokens:
            return
        self._roll(self.clock())
        counts = self._keys.get(key.id)
        if counts is None:
            counts = self._keys[key.id] = [0, 0]
        counts[0] += tokens
        counts[1] += tokens
        if key.team:
            total = self._teams.get(key.team)
            if total is None:
                total = self._teams[key.team] = [0, 0]
            total[0] += tokens
            total[1] += tokens

    # ---- the check ----------------------------------------------------------------------
    def check(self, key: BudgetedKey) -> None:
        """Raise BudgetExceeded if the key's or its team's budget is spent."""
        # hot path: runs once per request; most keys have no budget and stop here
        if key.budget is None and key.team_budget is None:
            return
        now = self.clock()
        self._roll(now)
        for scope, budget, counts in (("key", key.budget, self._keys.get(key.id)),
                                      ("team", key.team_budget, self._teams.get(key.team))):
            if budget is not None and self._spent(budget, counts) >= budget.tokens:
                period = self._day if budget.period == "day" else self._month
                raise BudgetExceeded(scope, budget, period.renews_at, now)

    def _spent(self, budget: Budget, counts: list[int] | None) -> int:
        daily = budget.period == "day"
        own = counts[0 if daily else 1] if counts is not None else 0
        if budget.period_start != (self._day if daily else self._month).start:
            return own  # the console's spend is of another period
        return budget.spent + max(0, own - budget.spent_here)

    def spent(self, key: BudgetedKey) -> dict[str, int]:
        """The router's estimate of each budget's spend (for ``GET /admin/keys``)."""
        self._roll(self.clock())
        answer = {}
        if key.budget is not None:
            answer["key"] = self._spent(key.budget, self._keys.get(key.id))
        if key.team_budget is not None:
            answer["team"] = self._spent(key.team_budget, self._teams.get(key.team))
        return answer
