"""The alert rules as a Prometheus rule file, and the gauges the console's /metrics adds for it.

A user who already runs Prometheus and Alertmanager scrapes the console's /metrics (one job, an
API token) and loads this file: the same rules then fire there, with the console's labels, so
that silences and routes written for one work for the other. The file follows the evaluator
(console/alerts/evaluation.py): a series is read per process (``deployment`` and ``process``,
the slot, as /metrics labels every re-exported sample; ``role`` comes from the slot's prefix,
since only ``pdserve_process_*`` carry one), folded over the rule's scope the way the series
folds (series.SeriesDef.fold), and aggregated over the rule's window.

Where PromQL says it differently:

- A series that Prometheus computes (a counter's rate, a quantile, a ratio) has no stored
  points, so its max, min, last and rate over the window run over a subquery, every 5 s, of
  its value over the last minute (a scrape interval of 30 s or less gives that two samples).
  A gauge, and an avg, aggregate the samples directly wherever the fold allows it (the fold is
  linear, the same extreme, or over one process); elsewhere the subquery folds first, as the
  evaluator does.
- A quantile's avg is the quantile over the whole window, Prometheus' idiom, not the mean of
  per-second quantiles.
- ``absent`` lists the instances the plan expects, as the evaluator does (absent() knows only
  the labels of equality matchers): the file reflects the plan it was written from.
- NoData has no Prometheus state: no data is no alert (the ``ok`` policy).
- ``min_count`` drops a ratio rule below its count, which resolves it in Prometheus where the
  console keeps its state; its keep_firing_for still bridges short quiet spells.
- ``deployment.metrics_missing`` is native: the (family, live worker) pairs where a worker that
  answers its /metrics lacks a vLLM family the deployment's rules read. It leaves out the
  router's families, whose labelled counters have no sample before their first request, which
  Prometheus cannot tell from a missing family. The other deployment series are the
  evaluator's facts, exported as ``pdserve_alert_fact{deployment, series}``.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import yaml
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from console.alerts import series as catalog
from console.alerts.models import AlertRule, Fact, Scope
from console.alerts.snapshots import first_ready, first_starts, frame
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node
from console.live.metrics_export import FRESH, latest_samples
from console.supervisor.models import ManagedProcess
from inference import prom_snapshot as prom

STEP = "5s"  # the group's interval, and the resolution of the subqueries
POINT = "1m"  # the range of a computed series' value at one instant

PROCESS_UP = "pdserve_process_up"
NODE_MEMORY = "pdserve_process_node_memory_bytes"
FACT = "pdserve_alert_fact"
CPU = "pdserve_process_cpu_percent"
RSS = "pdserve_process_rss_bytes"
_ROLE_LABELLED = (PROCESS_UP, NODE_MEMORY, CPU, RSS)

Kind = Literal["gauge", "counter", "histogram", "ratio", "fact", "missing"]


@dataclass(frozen=True)
class Reading:
    """How a series reads in PromQL."""

    kind: Kind
    metric: str = ""  # the sample name (a histogram's ``_bucket``; a ratio's denominator)
    matchers: str = ""
    numerator: str = ""
    numerator_matchers: str = ""
    divisor: str = ""  # a gauge over this gauge of the same process
    quantile: float = 0.95


READINGS: dict[str, Reading] = {
    "process.up": Reading("gauge", PROCESS_UP),
    "process.rss": Reading("gauge", RSS),
    "process.memory_ratio": Reading("gauge", RSS, divisor=NODE_MEMORY),
    "process.cpu": Reading("gauge", CPU),
    "worker.waiting": Reading("gauge", prom.WAITING),
    "worker.running": Reading("gauge", prom.RUNNING),
    "worker.kv_usage": Reading("gauge", prom.KV_USAGE),
    "worker.ttft_p95": Reading("histogram", f"{prom.TTFT}_bucket"),
    "worker.tpot_p95": Reading("histogram", f"{prom.TPOT}_bucket"),
    "worker.prompt_tps": Reading("counter", prom.PROMPT_TOKENS),
    "worker.gen_tps": Reading("counter", prom.GENERATION_TOKENS),
    "router.rps": Reading("counter", prom.ROUTER_REQUESTS),
    "router.ttft_p95": Reading("histogram", f"{prom.ROUTER_FIRST_BYTE}_bucket"),
    "router.handoff_p95": Reading("histogram", f"{prom.ROUTER_PREFILL}_bucket"),
    "router.5xx_ratio": Reading("ratio", prom.ROUTER_REQUESTS, numerator=prom.ROUTER_REQUESTS,
                                numerator_matchers='status=~"5.."'),
    "router.fallback_ratio": Reading("ratio", prom.ROUTER_REQUESTS,
                                     numerator=prom.ROUTER_FALLBACK),
    "router.handoff_failed_ratio": Reading("ratio", prom.ROUTER_HANDOFFS,
                                           matchers='outcome=~"ok|failed"',
                                           numerator=prom.ROUTER_HANDOFFS,
                                           numerator_matchers='outcome="failed"'),
    "deployment.metrics_missing": Reading("missing"),
    **{name: Reading("fact", FACT, matchers=f"series={json.dumps(name)}")
       for name, definition in catalog.SERIES.items()
       if not definition.per_process and name != "deployment.metrics_missing"},
}

_FOLDS = {"max": "max", "min": "min", "sum": "sum", "mean": "avg"}
# Aggregations over time that give the same as over the instances first, per fold.
_COMMUTES = {"avg": {"sum", "avg"}, "rate": {"sum", "avg"}, "max": {"max"}, "min": {"min"},
             "last": {"sum", "avg", "max", "min"}}
_SCOPE_LABELS = {Scope.DEPLOYMENT: ("deployment",), Scope.ROLE: ("deployment", "role"),
                 Scope.INSTANCE: ("deployment", "process", "role")}
# The console's summary placeholders (evaluation.render_summary).
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _quote(value: str) -> str:
    return json.dumps(value)


def _duration(seconds: int) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _number(value: float) -> str:
    value = float(value)  # a rule made in code may hold an int until it is read back
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _with_role(expr: str) -> str:
    return f'label_replace({expr}, "role", "$1", "process", "([a-z]+).*")'


def _over_time(aggregation: str) -> str:
    return "rate" if aggregation == "rate" else f"{aggregation}_over_time"


@dataclass(frozen=True)
class _Rule:
    """One rule's PromQL, built from its series' reading."""

    rule: AlertRule
    definition: catalog.SeriesDef
    reading: Reading
    deployment: str
    planned: dict[str, str]  # slot -> role, the router included
    group_rules: tuple[AlertRule, ...]  # the deployment's rules (metrics_missing reads theirs)

    @property
    def window(self) -> str:
        return _duration(self.rule.window_s)

    @property
    def scope(self) -> str:
        return self.rule.scope if self.definition.per_process else Scope.DEPLOYMENT

    @property
    def labels(self) -> tuple[str, ...]:
        return _SCOPE_LABELS[Scope(self.scope)]

    @property
    def fold(self) -> str:
        return _FOLDS[self.definition.fold]

    @property
    def one_instance(self) -> bool:
        """Whether the fold has one process to fold (the router's series, an instance rule)."""
        return self.scope == Scope.INSTANCE or self.definition.roles == ("router",)

    def select(self, metric: str, matchers: str = "", role: str | None = None,
               process: str = "") -> str:
        role = self.rule.role if role is None else role
        parts = [f"deployment={_quote(self.deployment)}"]
        if matchers:
            parts.append(matchers)
        if process:
            parts.append(f"process={_quote(process)}")
        elif role and metric in _ROLE_LABELLED:
            parts.append(f"role={_quote(role)}")
        elif role == "router":
            parts.append('process="router"')
        elif role:
            parts.append(f'process=~"{role}-.*"')
        return f"{metric}{{{', '.join(parts)}}}"

    def group(self, op: str, expr: str, keep: tuple[str, ...] = ()) -> str:
        """``expr``, labelled per process, to the rule's scope."""
        labels = self.labels
        inner = _with_role(expr) if "role" in labels else expr
        return f"{op} by ({', '.join((*keep, *labels))}) ({inner})"

    def direct(self) -> bool:
        return self.one_instance or self.fold in _COMMUTES[self.rule.aggregation]

    def subquery(self, expr: str) -> str:
        return f"{_over_time(self.rule.aggregation)}(({expr})[{self.window}:{STEP}])"

    # ---- the value, per kind -----------------------------------------------------------
    def value(self) -> str:
        kind = self.reading.kind
        if kind == "missing":
            missing = _missing_expr(self.deployment, self.group_rules)
            # Always computed, so never absent.
            return f"{missing} * 0" if self.rule.aggregation == "absent" else self.subquery(missing)
        if self.rule.aggregation == "absent":
            return self.absent()
        if kind == "gauge":
            return self._gauge()
        if kind == "counter":
            return self._counter()
        if kind == "histogram":
            return self._histogram()
        if kind == "ratio":
            return self._ratio()
        return self._fact()

    def _gauge(self) -> str:
        r = self.reading
        if self.direct():
            return self.group(self.fold, self._per_process(
                f"{_over_time(self.rule.aggregation)}({self.select(r.metric, r.matchers)}"
                f"[{self.window}])"))
        return self.subquery(self.group(self.fold, self._per_process(
            self.select(r.metric, r.matchers))))

    def _per_process(self, expr: str) -> str:
        if not self.reading.divisor:
            return expr
        # The node's memory is constant: over the window, the ratio of rss is rss' ratio.
        return (f"max by (deployment, process) ({expr}) / max by (deployment, process) "
                f"({self.select(self.reading.divisor)})")

    def _counter(self) -> str:
        if self.rule.aggregation == "avg" and self.direct():
            return self._rate_over(self.window)
        return self.subquery(self._rate_over(POINT))

    def _rate_over(self, range_: str) -> str:
        rate = f"rate({self.select(self.reading.metric, self.reading.matchers)}[{range_}])"
        if self.fold == "sum":
            return self.group("sum", rate)
        # A process's own series (status codes, engines) add up to its value first.
        return self.group(self.fold, f"sum by (deployment, process) ({rate})")

    def _quantile_over(self, range_: str) -> str:
        buckets = f"rate({self.select(self.reading.metric, self.reading.matchers)}[{range_}])"
        q = self.reading.quantile
        if self.one_instance:
            return f"histogram_quantile({q}, {self.group('sum', buckets, keep=('le',))})"
        per_process = f"histogram_quantile({q}, sum by (le, deployment, process) ({buckets}))"
        return self.group(self.fold, per_process)

    def _histogram(self) -> str:
        if self.rule.aggregation == "avg":
            return self._quantile_over(self.window)
        return self.subquery(self._quantile_over(POINT))

    def _ratio_over(self, range_: str) -> str:
        r = self.reading
        num = self.group("sum", f"increase({self.select(r.numerator, r.numerator_matchers)}[{range_}])")
        den = self.group("sum", f"increase({self.select(r.metric, r.matchers)}[{range_}])")
        # No failure yet is no numerator series at all: count it as 0, not as no data.
        return f"({num} or {den} * 0) / {den}"

    def _ratio(self) -> str:
        if self.rule.aggregation in ("avg", "rate"):
            return self._ratio_over(self.window)
        return self.subquery(self._ratio_over(POINT))

    def _fact(self) -> str:
        selector = self.select(self.reading.metric, self.reading.matchers, role="")
        return f"max by (deployment) ({_over_time(self.rule.aggregation)}({selector}[{self.window}]))"

    def absent(self) -> str:
        """1 for each expected instance without a point in the window, 0 for the others."""
        r = self.reading
        role_filter = "" if r.kind == "fact" else None
        present = self.group("max", f"count_over_time({self.select(r.metric, r.matchers, role_filter)}"
                                    f"[{self.window}])")
        parts = [f"{present} * 0"]
        for role, slot in self._expected():
            selector = self.select(r.metric, r.matchers, role=role_filter if role is None else role,
                                   process=slot)
            gone = f"absent_over_time({selector}[{self.window}])"
            if slot:
                gone = _with_role(f"max by (deployment, process) ({gone})")
            elif role:
                gone = f'label_replace(max by (deployment) ({gone}), "role", {_quote(role)}, "", "")'
            else:
                gone = f"max by (deployment) ({gone})"
            parts.append(gone)
        return f"({' or '.join(parts)})"

    def _expected(self) -> list[tuple[str | None, str]]:
        """(role, slot) of the instances the plan expects, as snapshots.expected."""
        if self.scope == Scope.DEPLOYMENT:
            return [(None, "")]
        expected: list[tuple[str | None, str]] = []
        for slot, role in sorted(self.planned.items()):
            if role not in self.definition.roles or (self.rule.role and role != self.rule.role):
                continue
            key: tuple[str | None, str] = (role, slot if self.scope == Scope.INSTANCE else "")
            if key not in expected:
                expected.append(key)
        return expected

    def expr(self) -> str:
        rule = self.rule
        expr = f"{self.value()} {rule.comparison} {_number(rule.threshold)}"
        if self.reading.kind == "ratio" and rule.min_count and rule.aggregation != "absent":
            den = self.select(self.reading.metric, self.reading.matchers)
            expr += (f" and on (deployment) sum by (deployment) (increase({den}[{self.window}]))"
                     f" >= {rule.min_count}")
        return expr

    # ---- labels and annotations --------------------------------------------------------
    def summary(self) -> str:
        labels = self.labels
        values = {
            "deployment": "{{ $labels.deployment }}",
            "role": "{{ $labels.role }}" if "role" in labels else "all roles",
            "instance": "{{ $labels.process }}" if "process" in labels
            else "{{ $labels.deployment }}",
            "series": _literal(self.rule.series),
            "threshold": _literal(f"{self.rule.threshold:.4g}"),
            "value": '{{ printf "%.4g" $value }}',
        }
        template = self.rule.summary or "{series} {value}"
        out, at = [], 0
        for match in _PLACEHOLDER.finditer(template):
            out.append(_literal(template[at:match.start()]))
            out.append(values.get(match.group(1), _literal(match.group(0))))
            at = match.end()
        out.append(_literal(template[at:]))
        return "".join(out)

    def as_prometheus(self) -> dict[str, Any]:
        rule = self.rule
        labels = {str(k): _literal(str(v)) for k, v in rule.labels.items()}
        labels.update(severity=str(rule.severity), deployment=self.deployment,
                      series=rule.series, pdserve_rule=str(rule.pk))
        if rule.key:
            labels["rule"] = rule.key
        annotations = {"summary": self.summary()}
        if rule.runbook_url:
            annotations["runbook_url"] = rule.runbook_url
        out: dict[str, Any] = {"alert": rule.alertname, "expr": self.expr(),
                               "for": _duration(rule.for_s)}
        # Prometheus before 2.42 rejects the field: written only where it is needed.
        if rule.keep_firing_for_s:
            out["keep_firing_for"] = _duration(rule.keep_firing_for_s)
        out["labels"] = labels
        out["annotations"] = annotations
        return out


def _literal(text: str) -> str:
    """Text as a Go template (Prometheus expands labels and annotations) that prints it."""
    return text.replace("{", '{{ "{" }}')


def _missing_expr(deployment: str, rules: Iterable[AlertRule]) -> str:
    """Per deployment, the (vLLM family, live worker) pairs where the worker lacks the family."""
    roles: dict[str, set[str]] = defaultdict(set)
    for rule in rules:
        definition = catalog.get(rule.series)
        reading = READINGS[rule.series]
        for metric in (reading.metric, reading.numerator):
            if metric.startswith("vllm:"):
                roles[metric].update([rule.role] if rule.role else definition.roles)
    zero = f'label_replace(vector(0), "deployment", {_quote(deployment)}, "", "")'
    pairs = []
    for metric, wanted in sorted(roles.items()):
        workers = (f"{PROCESS_UP}{{deployment={_quote(deployment)}, "
                   f"role=~{_quote('|'.join(sorted(wanted)))}}} == 1")
        lacking = f"{workers} unless on (deployment, process) {metric}{{deployment={_quote(deployment)}}}"
        pairs.append(f'label_replace({lacking}, "family", {_quote(metric)}, "", "")')
    if not pairs:
        return f"({zero})"
    return f"(count by (deployment) ({' or '.join(pairs)}) or {zero})"


def _planned(deployment: Deployment) -> dict[str, str]:
    return {worker.slot: worker.role for worker in deployment.workers.all()} | {"router": "router"}


def render_rule_file(rules: Iterable[AlertRule]) -> str:
    """The enabled rules as a Prometheus rule file: one group per deployment,
    ``pdserve-<deployment>``, evaluated every 5 s as the console evaluates them."""
    by_deployment: dict[int, list[AlertRule]] = defaultdict(list)
    deployments: dict[int, Deployment] = {}
    for rule in rules:
        if rule.enabled:
            by_deployment[rule.deployment_id].append(rule)
            deployments[rule.deployment_id] = rule.deployment
    groups = []
    for deployment_id, group in sorted(by_deployment.items(),
                                       key=lambda item: deployments[item[0]].name):
        deployment = deployments[deployment_id]
        planned = _planned(deployment)
        members = tuple(sorted(group, key=lambda rule: rule.pk))
        groups.append({"name": f"pdserve-{deployment.name}", "interval": STEP, "rules": [
            _Rule(rule, catalog.get(rule.series), _reading(rule), deployment.name, planned,
                  members).as_prometheus() for rule in members]})
    header = ("# pdserve's alert rules for Prometheus: scrape the console's /metrics (a job with "
              "an API token)\n# and list this file under rule_files.\n")
    return header + yaml.safe_dump({"groups": groups}, sort_keys=False, allow_unicode=True,
                                   width=1_000_000)


def _reading(rule: AlertRule) -> Reading:
    try:
        return READINGS[rule.series]
    except KeyError:
        raise ValueError(f"rule {rule.pk}: series {rule.series!r} has no PromQL") from None


# ---- the gauges on the console's /metrics -------------------------------------------------
def exported_families(now: datetime, deployments: Collection[int] | None) -> list[Metric]:
    """For each running deployment's latest snapshot, read as the evaluator reads it (a first
    start left out, a planned worker missing from it down): whether each process is up, its
    node's memory, and the deployment series that follow from the snapshot; beside them the
    facts the evaluator stored. A family without samples is left out."""
    labels = ["deployment", "process", "role"]
    up = GaugeMetricFamily(PROCESS_UP, "1 while the process answers its /metrics, 0 while it is "
                           "down or missing from a running deployment", labels=labels)
    memory = GaugeMetricFamily(NODE_MEMORY, "Memory of the node the process runs on",
                               labels=labels)
    facts = GaugeMetricFamily(FACT, "A deployment series that no process exports "
                              "(console/alerts/series.py), as the alert evaluator sees it",
                              labels=["deployment", "series"])
    samples = [sample for sample in latest_samples(now, deployments)
               if sample.deployment.desired_state == Deployment.DesiredState.RUNNING]
    ids = [sample.deployment_id for sample in samples]
    workers: dict[int, dict[str, WorkerPlan]] = defaultdict(dict)
    for worker in WorkerPlan.objects.filter(deployment__in=ids).select_related("node"):
        workers[worker.deployment_id][worker.slot] = worker
    processes: dict[int, dict[str, ManagedProcess]] = defaultdict(dict)
    for process in ManagedProcess.objects.filter(deployment__in=ids,
                                                 kind__in=ManagedProcess.PLANNED_KINDS):
        processes[process.deployment_id][process.slot] = process
    local = Node.objects.local()
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for sample in samples:
        name, planned = sample.deployment.name, workers[sample.deployment_id]
        starting = first_starts(planned, processes[sample.deployment_id])
        node_memory = {slot: worker.node.memory_bytes for slot, worker in planned.items()}
        node_memory["router"] = local.memory_bytes if local is not None else 0
        entries = frame(sample.created.timestamp(), sample.data.get("processes", {}), planned,
                        starting, node_memory, None,
                        first_ready(processes[sample.deployment_id])).processes
        for slot, entry in sorted(entries.items()):
            process_labels = [name, slot, entry.get("role", "")]
            if entry.get("up") is not None:
                up.add_metric(process_labels, entry["up"])
            if node_memory.get(slot):
                memory.add_metric(process_labels, node_memory[slot])
        values[name].update(catalog.deployment_facts(entries))
    stored = Fact.objects.filter(at__gte=now - FRESH).select_related("deployment")
    if deployments is not None:
        stored = stored.filter(deployment__in=deployments)
    for fact in stored:
        values[fact.deployment.name].setdefault(fact.series, fact.value)
    for name in sorted(values):
        for series, value in sorted(values[name].items()):
            facts.add_metric([name, series], value)
    return [family for family in (up, memory, facts) if family.samples]
