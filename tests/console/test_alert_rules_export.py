"""The alert rules as a Prometheus rule file: every series, aggregation, scope and role filter
passes ``promtool check rules``; ``promtool test rules`` shows the expressions fire on the data
they should and stay quiet on the rest; the console's /metrics carries the gauges they read."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.alerts import series as catalog
from console.alerts.models import Aggregation, AlertRule, Fact, Scope
from console.alerts.prometheus_rules import render_rule_file
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.live.models import MetricSample
from console.supervisor.models import ManagedProcess
from tests.console.team_users import make_crew
from tests.console.tokens import token_for

pytestmark = pytest.mark.django_db

# Prometheus adds these to every sample it scrapes from the console.
TARGET = 'job="pdserve", instance="console:8000"'


def promtool(*args: str) -> str:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: `make test` installs Debian's prometheus package"
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} refused:\n{output}"
    return output


def rule(deployment: Deployment, series: str, **fields: Any) -> AlertRule:
    fields.setdefault("name", f"{series} {fields.get('aggregation', 'avg')}")
    fields.setdefault("threshold", 1)
    return AlertRule.objects.create(deployment=deployment, series=series, **fields)


def rendered(rules: list[AlertRule]) -> dict[str, Any]:
    return yaml.safe_load(render_rule_file(rules))


def by_rule(document: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["labels"]["pdserve_rule"]): r for g in document["groups"] for r in g["rules"]}


def ready_made(deployment: Deployment) -> dict[str, AlertRule]:
    return {r.key: r for r in AlertRule.objects.filter(deployment=deployment).exclude(key="")}


def test_every_series_aggregation_scope_and_role_passes_promtool(
        deployment: Deployment, tmp_path: Path) -> None:
    rows = []
    for name, definition in catalog.SERIES.items():
        for role in ("", *definition.roles):
            for aggregation in Aggregation.values:
                for scope in Scope.values:
                    rows.append(AlertRule(
                        deployment=deployment, name=f"{name} {role} {aggregation} {scope}",
                        series=name, role=role, aggregation=aggregation, scope=scope,
                        window_s=90, comparison=">", threshold=0.5, for_s=30,
                        keep_firing_for_s=15, min_count=10 if definition.is_ratio else 0,
                        labels={"team": "inference", "odd": "a {b} {{c}}"},
                        summary="{deployment} {role} {instance}: {series} {value} over "
                                "{threshold}, {unknown} and {{braces}}",
                        runbook_url="https://runbooks.example/pdserve"))
    AlertRule.objects.bulk_create(rows)
    rule(deployment, "process.up", name="Switched off", enabled=False)
    rules = list(AlertRule.objects.filter(deployment=deployment).select_related("deployment"))
    path = tmp_path / "rules.yaml"
    path.write_text(render_rule_file(rules))

    output = promtool("check", "rules", "--lint-fatal", str(path))
    enabled = sum(1 for r in rules if r.enabled)
    assert f"SUCCESS: {enabled} rules found" in output
    document = yaml.safe_load(path.read_text())
    [group] = document["groups"]
    assert group["name"] == f"pdserve-{deployment.name}" and group["interval"] == "5s"
    assert "SwitchedOff" not in {r["alert"] for r in group["rules"]}
    # Every series, aggregation and scope is there, and each rule reads its series' metric.
    written = {(r["labels"]["series"], r["expr"]) for r in group["rules"]}
    assert {series for series, _ in written} == set(catalog.SERIES)
    assert all(len({e for s, e in written if s == name}) >= len(Aggregation.values)
               for name in catalog.SERIES)


def test_exact_expressions(deployment: Deployment) -> None:
    made = ready_made(deployment)
    d = deployment.name
    waiting_max = rule(deployment, "worker.waiting", aggregation="max", window_s=60)
    prompt_avg = rule(deployment, "worker.prompt_tps", aggregation="avg", window_s=120,
                      scope="role", role="prefill")
    cpu_absent = rule(deployment, "process.cpu", aggregation="absent", window_s=30,
                      scope="instance", role="decode", comparison=">", threshold=0)
    rules = [*made.values(), waiting_max, prompt_avg, cpu_absent]
    written = by_rule(rendered(rules))

    down = written[made["worker_down"].pk]
    assert down["alert"] == "WorkerDown" and down["for"] == "0s"
    assert down["expr"] == (
        'min by (deployment, process, role) (label_replace(last_over_time(pdserve_process_up'
        f'{{deployment="{d}"}}[10s]), "role", "$1", "process", "([a-z]+).*")) < 1')
    assert down["labels"] == {"category": "availability", "severity": "critical",
                              "deployment": d, "series": "process.up",
                              "pdserve_rule": str(made["worker_down"].pk), "rule": "worker_down"}
    assert down["annotations"] == {
        "summary": "{{ $labels.process }} of {{ $labels.deployment }} is down (not answering "
                   "its /metrics)"}

    requests = f'pdserve_router_requests_total{{deployment="{d}"}}'
    errors = f'pdserve_router_requests_total{{deployment="{d}", status=~"5.."}}'
    five = written[made["router_5xx"].pk]
    assert five["expr"] == (
        f"(sum by (deployment) (increase({errors}[5m])) or sum by (deployment) "
        f"(increase({requests}[5m])) * 0) / sum by (deployment) (increase({requests}[5m])) > 0.05"
        f" and on (deployment) sum by (deployment) (increase({requests}[5m])) >= 20")
    assert (five["for"], five["keep_firing_for"]) == ("1m", "2m")

    assert written[made["ttft_slo"].pk]["expr"] == (
        "histogram_quantile(0.95, sum by (le, deployment) (rate(pdserve_router_first_byte_"
        f'seconds_bucket{{deployment="{d}"}}[1m]))) > 2')
    assert written[made["tpot_slo"].pk]["expr"] == (
        "max by (deployment, role) (label_replace(histogram_quantile(0.95, sum by (le, "
        "deployment, process) (rate(vllm:request_time_per_output_token_seconds_bucket"
        f'{{deployment="{d}", process=~"decode-.*"}}[1m]))), "role", "$1", "process", '
        '"([a-z]+).*")) > 0.2')
    assert written[made["gate_failed"].pk]["expr"] == (
        "max by (deployment) (last_over_time(pdserve_alert_fact{deployment="
        f'"{d}", series="deployment.gate_failed"}}[30s])) > 0')
    assert written[made["memory_near_limit"].pk]["expr"] == (
        "max by (deployment, process, role) (label_replace(max by (deployment, process) "
        f'(max_over_time(pdserve_process_rss_bytes{{deployment="{d}"}}[1m])) / max by '
        f'(deployment, process) (pdserve_process_node_memory_bytes{{deployment="{d}"}}), '
        '"role", "$1", "process", "([a-z]+).*")) > 0.9')
    # The most requests waiting at once: summed over the workers first, as the console does.
    assert written[waiting_max.pk]["expr"] == (
        f'max_over_time((sum by (deployment) (vllm:num_requests_waiting{{deployment="{d}"}}))'
        "[1m:5s]) > 1")
    assert written[prompt_avg.pk]["expr"] == (
        "sum by (deployment, role) (label_replace(rate(vllm:prompt_tokens_total{deployment="
        f'"{d}", process=~"prefill-.*"}}[2m]), "role", "$1", "process", "([a-z]+).*")) > 1')
    # Absent per planned instance; present ones read 0.
    assert written[cpu_absent.pk]["expr"] == (
        "(max by (deployment, process, role) (label_replace(count_over_time(pdserve_process_cpu_"
        f'percent{{deployment="{d}", role="decode"}}[30s]), "role", "$1", "process", '
        '"([a-z]+).*")) * 0 or label_replace(max by (deployment, process) (absent_over_time('
        f'pdserve_process_cpu_percent{{deployment="{d}", process="decode-0"}}[30s])), "role", '
        '"$1", "process", "([a-z]+).*")) > 0')
    # Metrics absent: the vLLM families the other rules read, per live worker of their roles.
    missing = written[made["metrics_absent"].pk]["expr"]
    assert missing.startswith("last_over_time(((count by (deployment) (label_replace("
                              f'pdserve_process_up{{deployment="{d}", role=~"colocated|decode|'
                              'prefill"} == 1 unless on (deployment, process) vllm:kv_cache_usage_'
                              f'perc{{deployment="{d}"}}, "family", "vllm:kv_cache_usage_perc"')
    assert "pdserve_router" not in missing and "vllm:prompt_tokens_total" in missing


def test_the_expressions_fire_on_the_right_data(deployment: Deployment, tmp_path: Path) -> None:
    """``promtool test rules``: input series as Prometheus scrapes them from the console."""
    d = deployment.name
    made = ready_made(deployment)
    kv = rule(deployment, "worker.kv_usage", name="KV full", aggregation="max", window_s=30,
              comparison=">", threshold=0.9, for_s=30, scope="instance",
              labels={"note": "braces {{stay}}"},
              summary="{instance} ({role}): KV cache {value} used, over {threshold} {{as}} {is}")
    no_errors = rule(deployment, "router.5xx_ratio", name="No errors", aggregation="avg",
                     window_s=60, comparison="==", threshold=0)
    queue_high = rule(deployment, "worker.waiting", name="Queue over six", aggregation="max",
                      window_s=60, comparison=">", threshold=6)
    queue_some = rule(deployment, "worker.waiting", name="Queue over three", aggregation="max",
                      window_s=60, comparison=">", threshold=3)
    cpu_gone = rule(deployment, "process.cpu", name="CPU gone", aggregation="absent",
                    window_s=30, comparison=">", threshold=0, scope="instance")
    rules = [*made.values(), kv, no_errors, queue_high, queue_some, cpu_gone]
    (tmp_path / "rules.yaml").write_text(render_rule_file(rules))

    def labels(r: AlertRule, **extra: str) -> dict[str, str]:
        out = {str(k): str(v) for k, v in r.labels.items()}
        out.update(severity=str(r.severity), deployment=d, series=r.series, pdserve_rule=str(r.pk),
                   **extra)
        if r.key:
            out["rule"] = r.key
        return out

    def up(slot: str, values: str) -> dict[str, str]:
        role = slot.split("-")[0]
        return {"series": f'pdserve_process_up{{deployment="{d}", process="{slot}", '
                          f'role="{role}", {TARGET}}}', "values": values}

    def vllm(metric: str, slot: str, values: str, **extra: str) -> dict[str, str]:
        more = "".join(f', {k}="{v}"' for k, v in extra.items())
        return {"series": f'{metric}{{deployment="{d}", process="{slot}", engine="0", '
                          f'model_name="smollm2"{more}, {TARGET}}}', "values": values}

    def router(metric: str, values: str, **extra: str) -> dict[str, str]:
        more = "".join(f', {k}="{v}"' for k, v in extra.items())
        return {"series": f'{metric}{{deployment="{d}", process="router"{more}, {TARGET}}}',
                "values": values}

    tests = [
        {   # KV usage above 0.9 from 60 s: pending, then firing once it held 30 s.
            "interval": "5s",
            "input_series": [
                vllm("vllm:kv_cache_usage_perc", "decode-0", "0.5x11 0.95x30"),
                vllm("vllm:kv_cache_usage_perc", "prefill-0", "0.2x41"),
            ],
            "alert_rule_test": [
                {"eval_time": "80s", "alertname": "KVFull", "exp_alerts": []},
                {"eval_time": "95s", "alertname": "KVFull", "exp_alerts": [{
                    "exp_labels": labels(kv, process="decode-0", role="decode"),
                    # Braces and unknown placeholders stay as written, as in the console.
                    "exp_annotations": {"summary": "decode-0 (decode): KV cache 0.95 used, "
                                                   "over 0.9 {{as}} {is}"}}]},
            ],
        },
        {   # decode-0 stops answering at 25 s: down at once; the router stays up.
            "interval": "5s",
            "input_series": [up("decode-0", "1x4 0x10"), up("router", "1x14")],
            "alert_rule_test": [
                {"eval_time": "20s", "alertname": "WorkerDown", "exp_alerts": []},
                {"eval_time": "30s", "alertname": "WorkerDown", "exp_alerts": [{
                    "exp_labels": labels(made["worker_down"], process="decode-0", role="decode"),
                    "exp_annotations": {"summary": f"decode-0 of {d} is down (not answering "
                                                   "its /metrics)"}}]},
            ],
        },
        {   # Half the answers fail, but some 10 requests in 5 minutes are below the rule's 20.
            "interval": "1m",
            "input_series": [
                router("pdserve_router_requests_total", "0+1x10", endpoint="chat", status="200",
                       role="prefill+decode"),
                router("pdserve_router_requests_total", "0+1x10", endpoint="chat", status="500",
                       role="prefill+decode"),
            ],
            "alert_rule_test": [{"eval_time": "9m", "alertname": "Router5xxRatio",
                                 "exp_alerts": []}],
        },
        {   # 1 in 11 answers fails at 11 requests a second: pending for a minute, then firing.
            "interval": "5s",
            "input_series": [
                router("pdserve_router_requests_total", "0+50x40", endpoint="chat", status="200",
                       role="prefill+decode"),
                router("pdserve_router_requests_total", "0+5x40", endpoint="chat",
                       status="500", role="prefill+decode"),
            ],
            "alert_rule_test": [
                {"eval_time": "30s", "alertname": "Router5xxRatio", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "Router5xxRatio", "exp_alerts": [{
                    "exp_labels": labels(made["router_5xx"]),
                    "exp_annotations": {"summary": f"{d}: 0.09091 of answers are 5xx over 5 "
                                                   "minutes"}}]},
                {"eval_time": "2m", "alertname": "NoErrors", "exp_alerts": []},
            ],
        },
        {   # No 5xx series at all (none answered yet) reads as a ratio of 0, not as no data.
            "interval": "5s",
            "input_series": [router("pdserve_router_requests_total", "0+50x40", endpoint="chat",
                                    status="200", role="prefill+decode")],
            "alert_rule_test": [{"eval_time": "100s", "alertname": "NoErrors", "exp_alerts": [{
                "exp_labels": labels(no_errors),
                "exp_annotations": {"summary": "router.5xx_ratio 0"}}]}],
        },
        {   # Both workers answer; prefill-0 lacks the KV usage the rules read until 60 s.
            "interval": "5s",
            "input_series": [
                up("prefill-0", "1x25"), up("decode-0", "1x25"),
                vllm("vllm:kv_cache_usage_perc", "prefill-0", "_x12 0.1x13"),
                vllm("vllm:kv_cache_usage_perc", "decode-0", "0.1x25"),
                vllm("vllm:num_requests_waiting", "prefill-0", "0x25"),
                vllm("vllm:num_requests_waiting", "decode-0", "0x25"),
                vllm("vllm:request_time_per_output_token_seconds_bucket", "decode-0", "0x25",
                     le="+Inf"),
            ],
            "alert_rule_test": [
                {"eval_time": "20s", "alertname": "MetricsAbsent", "exp_alerts": []},
                {"eval_time": "40s", "alertname": "MetricsAbsent", "exp_alerts": [{
                    "exp_labels": labels(made["metrics_absent"]),
                    "exp_annotations": {"summary": f"{d}: 1 metric families its rules need "
                                                   "are missing"}}]},
                {"eval_time": "100s", "alertname": "MetricsAbsent", "exp_alerts": []},
            ],
        },
        {   # The queues take turns: 4 waiting at any instant, 4 on each worker at most. The
            # most waiting at once is 4, as the console folds it, not 8.
            "interval": "5s",
            "input_series": [vllm("vllm:num_requests_waiting", "prefill-0", "4 0 " * 7 + "4"),
                             vllm("vllm:num_requests_waiting", "decode-0", "0 4 " * 7 + "0")],
            "alert_rule_test": [
                {"eval_time": "60s", "alertname": "QueueOverSix", "exp_alerts": []},
                {"eval_time": "60s", "alertname": "QueueOverThree", "exp_alerts": [{
                    "exp_labels": labels(queue_some),
                    "exp_annotations": {"summary": "worker.waiting 4"}}]},
            ],
        },
        {   # Only prefill-0 reports its CPU: the plan's decode-0 and router are absent.
            "interval": "5s",
            "input_series": [{"series": f'pdserve_process_cpu_percent{{deployment="{d}", '
                                        f'process="prefill-0", role="prefill", {TARGET}}}',
                              "values": "10x12"}],
            "alert_rule_test": [{"eval_time": "55s", "alertname": "CPUGone", "exp_alerts": [
                {"exp_labels": labels(cpu_gone, process="decode-0", role="decode"),
                 "exp_annotations": {"summary": "process.cpu 1"}},
                {"exp_labels": labels(cpu_gone, process="router", role="router"),
                 "exp_annotations": {"summary": "process.cpu 1"}},
            ]}],
        },
        {   # The router's time to first byte: every answer between 1 and 5 s, p95 4.8 s.
            "interval": "5s",
            "input_series": [
                router("pdserve_router_first_byte_seconds_bucket", values, endpoint=endpoint, le=le)
                for endpoint in ("chat", "completions")
                for le, values in (("1.0", "0x30"), ("5.0", "0+2x30"), ("+Inf", "0+2x30"))],
            "alert_rule_test": [
                {"eval_time": "50s", "alertname": "TTFTOverSLO", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "TTFTOverSLO", "exp_alerts": [{
                    "exp_labels": labels(made["ttft_slo"]),
                    "exp_annotations": {"summary": f"{d}: time to first token p95 is 4.8 s, "
                                                   "the SLO 2 s"}}]},
            ],
        },
        {   # The evaluator's fact: one role has a ready worker, the other none.
            "interval": "5s",
            "input_series": [{"series": f'pdserve_alert_fact{{deployment="{d}", '
                                        f'series="deployment.one_sided", {TARGET}}}',
                              "values": "0x3 1x10"}],
            "alert_rule_test": [
                {"eval_time": "20s", "alertname": "OneRoleWithoutAReadyWorker", "exp_alerts": []},
                {"eval_time": "30s", "alertname": "OneRoleWithoutAReadyWorker", "exp_alerts": [{
                    "exp_labels": labels(made["role_unavailable"]),
                    "exp_annotations": {"summary": f"{d}: one role has a ready worker, the "
                                                   "other none"}}]},
            ],
        },
    ]
    unit = tmp_path / "rules_test.yaml"
    unit.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "5s",
                                    "tests": tests}, sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", str(unit))


# ---- the gauges on /metrics ---------------------------------------------------------------
def families(body: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(body)}


def scraped(user: User) -> dict[str, list[tuple[dict[str, str], float]]]:
    client = Client(headers={"Authorization": f"Bearer {token_for(user, 'prometheus')}"})
    response = client.get("/metrics")
    assert response.status_code == 200
    return families(response.content.decode())


def test_metrics_export_the_gauges_the_rules_read(deployment: Deployment, owner: User) -> None:
    now = timezone.now()
    d = deployment.name
    deployment.desired_state = Deployment.DesiredState.RUNNING
    deployment.save(update_fields=["desired_state"])
    Node.objects.filter(pk__in=deployment.workers.values("node")).update(memory_bytes=8 << 30)
    Node.objects.filter(is_local=True).update(memory_bytes=8 << 30)
    for slot in ("prefill-0", "decode-0", "router"):
        ManagedProcess.objects.create(deployment=deployment, slot=slot, role=slot.split("-")[0],
                                      port=1, state=ManagedProcess.State.READY, ready_at=now,
                                      log_path="/dev/null")
    # decode-0 is missing from the snapshot: planned, so down.
    MetricSample.objects.create(deployment=deployment, resolution="1s", created=now, data={
        "processes": {"prefill-0": {"role": "prefill", "up": 1, "rss": 1 << 30},
                      "router": {"role": "router", "up": 1, "rss": 1 << 28}}})
    Fact.objects.create(deployment=deployment, series="deployment.gate_failed", value=1, at=now)
    Fact.objects.create(deployment=deployment, series="deployment.foreign_ports", value=2,
                        at=now - timedelta(minutes=5))

    parsed = scraped(owner)
    assert parsed["pdserve_process_up"] == [
        ({"deployment": d, "process": "decode-0", "role": "decode"}, 0.0),
        ({"deployment": d, "process": "prefill-0", "role": "prefill"}, 1.0),
        ({"deployment": d, "process": "router", "role": "router"}, 1.0),
    ]
    assert {labels["process"]: value for labels, value
            in parsed["pdserve_process_node_memory_bytes"]} == {
        "decode-0": 8 << 30, "prefill-0": 8 << 30, "router": 8 << 30}
    # The snapshot's deployment series beside the evaluator's fresh facts (a stale one is gone).
    assert {labels["series"]: value for labels, value in parsed["pdserve_alert_fact"]} == {
        "deployment.gate_failed": 1.0, "deployment.ready_prefill": 1.0,
        "deployment.ready_decode": 0.0, "deployment.one_sided": 1.0}
    assert all(labels["deployment"] == d for labels, _ in parsed["pdserve_alert_fact"])


def test_a_first_start_and_a_stopped_deployment_export_no_outage(
        deployment: Deployment, owner: User) -> None:
    now = timezone.now()
    deployment.desired_state = Deployment.DesiredState.RUNNING
    deployment.save(update_fields=["desired_state"])
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode", port=1,
                                  state=ManagedProcess.State.STARTING, log_path="/dev/null")
    ManagedProcess.objects.create(deployment=deployment, slot="prefill-0", role="prefill", port=2,
                                  state=ManagedProcess.State.READY, ready_at=now,
                                  log_path="/dev/null")
    MetricSample.objects.create(deployment=deployment, resolution="1s", created=now, data={
        "processes": {"decode-0": {"role": "decode", "up": 0},
                      "prefill-0": {"role": "prefill", "up": 1}}})
    assert [(labels["process"], value) for labels, value
            in scraped(owner)["pdserve_process_up"]] == [("prefill-0", 1.0)]

    deployment.desired_state = Deployment.DesiredState.STOPPED
    deployment.save(update_fields=["desired_state"])
    assert "pdserve_process_up" not in scraped(owner)


def test_a_reader_gets_the_gauges_of_their_teams_deployments_only(
        deployment: Deployment) -> None:
    crew = make_crew()
    now = timezone.now()
    Fact.objects.create(deployment=deployment, series="deployment.gate_failed", value=1, at=now)
    assert [labels["deployment"] for labels, _ in scraped(crew.viewer)["pdserve_alert_fact"]] \
        == [deployment.name]
    assert "pdserve_alert_fact" not in scraped(crew.stranger)
