"""Usage metering in the console. Each deployment's router counts what it serves per UTC day
and key in a ledger file under the data directory, which outlives the router
(inference/router/usage.py); the supervisor's key sync reads it every round
(console/gateway/sync.py) and stores it here as ``UsageDay`` rows, which the API, the usage page,
the CSV export and the console's /metrics read.

Why the stored counters are *replaced* by the router's, never added to: the router answers
totals (what its ledger holds for the day since the file was made), not what changed since the
last read. Adding them would count every request once per round. Replacing makes a read
idempotent: a round that failed, ran twice or ran in two supervisors at once changes nothing,
and a router restarted on the same file goes on from its stored totals, so the console's
totals span the router's restarts with no bookkeeping of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import F, Max, QuerySet, Sum
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from console.deployments.models import Deployment
from console.gateway.models import ApiKey, UsageDay
from console.gateway.router_admin import CONSOLE_KEY_PREFIX, LedgerRow
from inference.router.keys import CONSOLE_KEY_ID, KEY_PREFIX

# What a read replaces in a stored row (besides ``updated``).
REPLACED = ("deployment", "key", "key_prefix", "team", "model", "requests", "errors",
            "prompt_tokens", "completion_tokens", "latency_ms_sum")
COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens")

# What the API and the page group by: each dimension's fields in an aggregated row.
DIMENSIONS: dict[str, dict[str, str]] = {
    "day": {"day": "day"},
    "team": {"team": "team", "team_name": "team__name"},
    "key": {"key": "key", "key_prefix": "key_prefix", "key_name": "key__name"},
    "model": {"model": "model"},
    "deployment": {"deployment": "deployment", "deployment_name": "deployment_name"},
}
# How groups are ordered: by what a reader sees, then by id. Foreign keys by their column
# ("team_id"): ordering by "team" would follow the team's own ordering, through a join.
ORDERING: dict[str, tuple[str, ...]] = {
    "day": ("day",),
    "team": ("team_name", "team_id"),
    "key": ("key_prefix", "key_id"),
    "model": ("model",),
    "deployment": ("deployment_name", "deployment_id"),
}


def usage_file_path(deployment: Deployment) -> Path:
    """The ledger file the deployment's router is started with (``--usage-file``): under the
    data directory, named by the deployment's name alone (a slug its model validates), never by
    any other input."""
    name = deployment.name
    if not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"not a deployment name to make a file name of: {name!r}")
    return Path(settings.DATA_DIR) / "usage" / f"{name}.sqlite3"


def ledger_since(deployment: Deployment, today: date) -> date | None:
    """The first day to ask the deployment's router for: yesterday (answers that ended just
    before midnight UTC may be read only after it), or the last day stored if that is earlier
    (a router that could not be read for days, a console that was down); None, everything, for
    a deployment with nothing stored yet. Earlier days are final and are not read again."""
    last = UsageDay.objects.filter(deployment_name=deployment.name).aggregate(
        last=Max("day"))["last"]
    if last is None:
        return None
    return min(last, today - timedelta(days=1))


def _key_ids(rows: Iterable[LedgerRow]) -> set[int]:
    # str.isdigit() holds for '²' too; and no id beyond 64 bits reaches the database.
    return {int(row.key) for row in rows
            if row.key.isascii() and row.key.isdigit() and len(row.key) <= 18}


def store_ledger(deployment: Deployment, rows: Iterable[LedgerRow]) -> int:
    """Store the router's ledger rows as the deployment's ``UsageDay`` rows, replacing the
    counters of those already stored. A key id the console knows gives the row its key, prefix
    and team; the playground's key is named as such; any other id (none, or one the console has
    no key for) is stored without a key, under the deployment's team. Returns how many rows
    were written (new or changed)."""
    rows = list(rows)
    if not rows:
        return 0
    keys = {str(key.pk): key for key in ApiKey.objects.filter(pk__in=_key_ids(rows))}
    stored = {(usage.day, usage.router_key): usage for usage in UsageDay.objects.filter(
        deployment_name=deployment.name, day__in={row.day for row in rows})}
    changed = []
    for row in rows:
        key = keys.get(row.key)
        prefix = key.prefix if key is not None else (
            CONSOLE_KEY_PREFIX if row.key == CONSOLE_KEY_ID else "")
        values: dict[str, Any] = {
            "deployment_id": deployment.pk, "key_id": key.pk if key is not None else None,
            "key_prefix": prefix, "team_id": key.team_id if key is not None else deployment.team_id,
            "model": deployment.served_model_name, "requests": row.requests, "errors": row.errors,
            "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
            "latency_ms_sum": row.latency_ms_sum,
        }
        current = stored.get((row.day, row.key))
        if current is not None and all(getattr(current, name) == value
                                       for name, value in values.items()):
            continue  # unchanged: ``updated`` keeps saying when it last changed
        changed.append(UsageDay(day=row.day, deployment_name=deployment.name,
                                router_key=row.key, **values))
    # One statement, an upsert on the unique (deployment, day, key id): a supervisor reading
    # the same router at the same time writes the same totals, never a second row.
    UsageDay.objects.bulk_create(changed, update_conflicts=True,
                                 unique_fields=["deployment_name", "day", "router_key"],
                                 update_fields=[*REPLACED, "updated"])
    return len(changed)


def aggregate(rows: QuerySet[UsageDay], group_by: list[str]) -> QuerySet[UsageDay]:
    """``rows`` summed per group (dimensions of ``DIMENSIONS``), ordered by them: dicts with
    the groups' fields and the counters' sums (``latency_ms_avg()`` gives the mean latency)."""
    fields = {name: source for dimension in group_by
              for name, source in DIMENSIONS[dimension].items()}
    # values() takes a model field by its name and anything else as a named expression.
    plain = [name for name, source in fields.items() if name == source]
    named = {name: F(source) for name, source in fields.items() if name != source}
    ordering = [field for dimension in group_by for field in ORDERING[dimension]]
    return (rows.values(*plain, **named)
            .annotate(**{name: Sum(name) for name in (*COUNTERS, "latency_ms_sum")})
            .order_by(*ordering))


def latency_ms_avg(row: dict[str, Any]) -> float | None:
    """Mean time from arrival to the end of the answer, over the group's requests."""
    return round(row["latency_ms_sum"] / row["requests"], 3) if row["requests"] else None


def key_label(prefix: str) -> str:
    """A key as the routers' metrics label it (``pds_<prefix>``); empty without a key."""
    return f"{KEY_PREFIX}{prefix}" if prefix else ""


def usage_families(_now: datetime, deployments: Collection[int] | None) -> list[Metric]:
    """The stored usage, summed over days, for the console's /metrics: tokens and requests per
    team, key and model. Counters: a stored row only grows (a router's totals do), and rows are
    never deleted. The reader's deployments (None: all) stand for their teams, whose rows they
    see; a family without samples is left out."""
    rows = UsageDay.objects.all()
    if deployments is not None:
        rows = rows.filter(team__in=Deployment.objects.filter(pk__in=deployments).values("team"))
    labels = ["team", "key", "model"]
    tokens = CounterMetricFamily("pdserve_usage_tokens",
                                 "Tokens metered by the routers' usage ledgers, as stored by the "
                                 "console", labels=[*labels, "kind"])
    requests = CounterMetricFamily("pdserve_usage_requests",
                                   "Requests metered by the routers' usage ledgers, as stored by "
                                   "the console", labels=[*labels, "outcome"])
    sums = (rows.values("team__name", "key_prefix", "model")
            .annotate(**{name: Sum(name) for name in COUNTERS})
            .order_by("team__name", "key_prefix", "model"))
    for row in sums:
        common = [row["team__name"] or "", key_label(row["key_prefix"]), row["model"]]
        tokens.add_metric([*common, "prompt"], row["prompt_tokens"])
        tokens.add_metric([*common, "completion"], row["completion_tokens"])
        requests.add_metric([*common, "ok"], row["requests"] - row["errors"])
        requests.add_metric([*common, "error"], row["errors"])
    return [family for family in (tokens, requests) if family.samples]
