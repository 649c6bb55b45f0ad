"""The rules every deployment gets when it is created: editable, each with the reason it exists.

The README lists them (its "Alerts" section); ``tests/console/test_alert_ready_made.py`` holds
the two to each other. Thresholds follow the plan where the plan has a number for them (SLOs,
concurrency); the others are where the peers put them or where pdserve's own limits are.
"""

from __future__ import annotations

from typing import Any

# What an outage of one worker brings with it: slow answers, and a role left without workers.
FOLLOWS_OUTAGE = [{"name": "category", "op": "=~", "value": "latency|pool"}]


def rule_specs(deployment: Any) -> list[dict[str, Any]]:
    """The ready-made rules of ``deployment`` (a Deployment, or a migration's historical one),
    as AlertRule fields."""
    pd = deployment.mode == "pd"
    generator = "decode" if pd else "colocated"
    slo_ttft, slo_tpot = deployment.ttft_slo_ms / 1000, deployment.tpot_slo_ms / 1000
    queue = max(1, deployment.concurrency)
    specs: list[dict[str, Any]] = [
        dict(key="worker_down", name="Worker down", series="process.up", aggregation="last",
             window_s=10, comparison="<", threshold=1, severity="critical", scope="instance",
             nodata="ok", labels={"category": "availability"}, inhibits=FOLLOWS_OUTAGE,
             summary="{instance} of {deployment} is down (not answering its /metrics)",
             reason="a worker or the router stopped answering after it had been up; while it "
                    "fires, the deployment's latency alerts and 'one role without a ready "
                    "worker' are muted (they follow from it)"),
        dict(key="handoff_slow", name="KV hand-off slow", series="router.handoff_p95",
             aggregation="avg", window_s=60, comparison=">", threshold=0.5, for_s=60,
             severity="warning", labels={"category": "latency"}, nodata="ok",
             summary="{deployment}: prefill plus KV hand-off p95 is {value} s (over {threshold} s)",
             reason="500 ms is the KV transfer timeout of the seed's example configuration: "
                    "past it, decode waits on prefill's KV more than it computes"),
        dict(key="ttft_slo", name="TTFT over SLO", series="router.ttft_p95", aggregation="avg",
             window_s=60, comparison=">", threshold=slo_ttft, for_s=60, severity="warning",
             labels={"category": "latency"}, nodata="ok",
             summary="{deployment}: time to first token p95 is {value} s, the SLO {threshold} s",
             reason="the plan's TTFT SLO, measured where clients see it: the router"),
        dict(key="tpot_slo", name="TPOT over SLO", series="worker.tpot_p95", role=generator,
             aggregation="avg", window_s=60, comparison=">", threshold=slo_tpot, for_s=60,
             severity="warning", scope="role", labels={"category": "latency"}, nodata="ok",
             summary="{deployment}: time per output token p95 on {role} is {value} s, "
                     "the SLO {threshold} s",
             reason="the plan's TPOT SLO, on the workers that generate"),
        dict(key="decode_queue", name=f"{generator.capitalize()} queue", series="worker.waiting",
             role=generator, aggregation="avg", window_s=60, comparison=">", threshold=queue,
             for_s=120, severity="warning", scope="role", nodata="ok",
             labels={"category": "saturation"},
             summary="{deployment}: {value} requests wait on {role} (more than the plan's "
                     "concurrency, {threshold}) for 2 minutes",
             reason="more requests waiting than the plan's concurrency for minutes: the pool is "
                    "too small for the traffic"),
        dict(key="kv_cache_full", name="KV cache nearly full", series="worker.kv_usage",
             aggregation="avg", window_s=60, comparison=">", threshold=0.9, for_s=120,
             severity="warning", scope="instance", nodata="ok", labels={"category": "saturation"},
             summary="{instance}: KV cache {value} used (over {threshold})",
             reason="above 90% the engine preempts running requests and recomputes them"),
        dict(key="memory_near_limit", name="Memory near the node's limit",
             series="process.memory_ratio", aggregation="max", window_s=60, comparison=">",
             threshold=0.9, for_s=60, severity="critical", scope="instance", nodata="ok",
             labels={"category": "saturation"},
             summary="{instance} uses {value} of its node's memory",
             reason="a worker near the node's memory is the next one the kernel's OOM killer "
                    "takes"),
        dict(key="router_5xx", name="Router 5xx ratio", series="router.5xx_ratio",
             aggregation="avg", window_s=300, comparison=">", threshold=0.05, for_s=60,
             keep_firing_for_s=120, min_count=20, severity="critical", nodata="ok",
             labels={"category": "errors"},
             summary="{deployment}: {value} of answers are 5xx over 5 minutes",
             reason="llm-d's error-ratio rule, with a minimum of 20 requests and "
                    "keep_firing_for so that it does not flap at low traffic"),
        dict(key="port_foreign", name="Planned port taken", series="deployment.foreign_ports",
             aggregation="last", window_s=15, comparison=">", threshold=0, severity="critical",
             nodata="ok", labels={"category": "availability"},
             summary="{deployment}: {value} planned port(s) bound by another process",
             reason="a process outside the deployment holds a planned port: the worker that "
                    "should bind it cannot restart"),
        dict(key="metrics_absent", name="Metrics absent", series="deployment.metrics_missing",
             aggregation="last", window_s=30, comparison=">", threshold=0, for_s=30,
             severity="warning", nodata="ok", labels={"category": "observability"},
             summary="{deployment}: {value} metric families its rules need are missing",
             reason="a renamed or dropped engine metric makes a rule match nothing, silently; "
                    "this names the families a live worker lacks"),
        dict(key="gate_failed", name="Output gate failed", series="deployment.gate_failed",
             aggregation="last", window_s=30, comparison=">", threshold=0, severity="critical",
             nodata="ok", labels={"category": "quality"},
             summary="{deployment}: the output gate failed",
             reason="the workers' answers differ from the reference model's beyond the plan's "
                    "thresholds"),
        dict(key="scale_refused", name="Scale-up refused", series="deployment.scale_refused",
             aggregation="last", window_s=30, comparison=">", threshold=0, severity="warning",
             nodata="ok", labels={"category": "capacity"},
             summary="{deployment}: the autoscaler cannot grow a pool: the node lacks the "
                     "memory for another instance",
             reason="a pool policy asks for an instance the node's memory cannot hold; the "
                    "autoscaler's decision says which and by how much (KEDA's users get a "
                    "silent fallback instead)"),
        dict(key="node_down", name="Node down", series="deployment.node_down",
             aggregation="last", window_s=30, comparison=">", threshold=0, severity="critical",
             nodata="ok", labels={"category": "availability"},
             summary="{deployment}: {value} node(s) of its workers are down (no agent heartbeat)",
             reason="a node agent missed its heartbeats for the grace (PDSERVE_AGENT_GRACE_MS): "
                    "its workers may still serve, but nothing restarts them there; nothing is "
                    "rescheduled unless the plan is changed"),
        dict(key="gateway_shedding", name="Gateway shedding", series="deployment.gateway_shed_ps",
             aggregation="avg", window_s=60, comparison=">", threshold=0.05, for_s=60,
             keep_firing_for_s=60, severity="warning", nodata="ok",
             labels={"category": "saturation"},
             summary="{deployment}: the gateway refuses {value} requests/s (shed or timed out "
                     "in its queue)",
             reason="the gateway sheds the lowest priority band first once the deployment is "
                    "saturated and its queue full: more than 3 refusals a minute means clients "
                    "are turned away; add instances or lower the traffic of the band shed"),
    ]
    if pd:
        specs += [
            dict(key="role_unavailable", name="One role without a ready worker",
                 series="deployment.one_sided", aggregation="last", window_s=10, comparison=">=",
                 threshold=1, for_s=10, severity="critical", nodata="ok",
                 labels={"category": "pool"},
                 summary="{deployment}: one role has a ready worker, the other none",
                 reason="prefill or decode has no ready worker: requests run degraded on the "
                        "other role, or fail"),
            dict(key="handoff_failures", name="KV hand-off failures",
                 series="router.handoff_failed_ratio", aggregation="avg", window_s=60,
                 comparison=">", threshold=0.05, for_s=30, keep_firing_for_s=60, min_count=20,
                 severity="warning", nodata="ok", labels={"category": "errors"},
                 summary="{deployment}: {value} of KV hand-offs failed in a minute",
                 reason="hand-offs that fail make decode recompute prompts or fail requests"),
            dict(key="prefill_queue", name="Prefill queue", series="worker.waiting",
                 role="prefill", aggregation="avg", window_s=60, comparison=">",
                 threshold=queue, for_s=120, severity="warning", scope="role", nodata="ok",
                 labels={"category": "saturation"},
                 summary="{deployment}: {value} prompts wait on prefill for 2 minutes",
                 reason="prompts waiting on prefill add straight to TTFT"),
            dict(key="pd_fallback", name="PD fallbacks", series="router.fallback_ratio",
                 aggregation="avg", window_s=300, comparison=">", threshold=0.05, for_s=60,
                 min_count=20, severity="warning", nodata="ok", labels={"category": "errors"},
                 summary="{deployment}: decode recomputed {value} of prompts",
                 reason="the seed's 'output differs from the single server' symptom: decode "
                        "computed prompts itself instead of loading prefill's KV"),
            dict(key="pd_load_skew", name="P:D load drift", series="deployment.pd_load_skew",
                 aggregation="avg", window_s=300, comparison=">", threshold=2, for_s=300,
                 severity="info", nodata="ok", labels={"category": "capacity"},
                 summary="{deployment}: one side carries 2^{value} times the other's load per "
                         "worker",
                 reason="the traffic's prompt/answer mix moved away from what the P:D worker "
                        "counts were sized for: resize the pools"),
        ]
    return specs


def ensure_rules(deployment: Any, rule_model: Any) -> int:
    """Create the ready-made rules the deployment lacks (an edited one is left as it is)."""
    have = set(rule_model.objects.filter(deployment=deployment).exclude(key="")
               .values_list("key", flat=True))
    created = 0
    for spec in rule_specs(deployment):
        fields = {k: v for k, v in spec.items() if k != "reason"}
        if fields["key"] in have:
            continue
        rule_model.objects.create(deployment=deployment, **fields)
        created += 1
    return created


# The ready-made rules whose threshold is a number of the plan: (key, plan field, scale).
FROM_PLAN = (("ttft_slo", "ttft_slo_ms", 1 / 1000), ("tpot_slo", "tpot_slo_ms", 1 / 1000),
             ("decode_queue", "concurrency", 1), ("prefill_queue", "concurrency", 1))


# The ready-made rules only a PD plan has (their series or role need prefill and decode).
PD_ONLY = ("role_unavailable", "handoff_failures", "prefill_queue", "pd_fallback", "pd_load_skew")
# The rules whose role (and name) follow the generating role: decode in PD, colocated else.
FOLLOW_GENERATOR = ("tpot_slo", "decode_queue")


def follow_topology(before: Any, after: Any, rule_model: Any) -> int:
    """After a switch between PD and colocated (a plan edit, or a rollout's promotion), the
    ready-made rules are made again for the new topology: the rules of the generating role
    move to it (decode <-> colocated) with their thresholds, ``for`` and the rest as they are;
    the PD-only rules are disabled while the plan is colocated and enabled again (thresholds
    kept) when it is PD; ready-made rules the plan lacks are created. Returns the rules
    changed or created."""
    if before.mode == after.mode:
        return 0
    old_specs = {spec["key"]: spec for spec in rule_specs(before)}
    new_specs = {spec["key"]: spec for spec in rule_specs(after)}
    changed = 0
    rules = rule_model.objects.filter(deployment=after)
    for key in FOLLOW_GENERATOR:
        old, new = old_specs[key], new_specs[key]
        for rule in rules.filter(key=key):
            fields = {name: new[name] for name in ("role", "name")
                      if getattr(rule, name) == old[name] and old[name] != new[name]}
            if fields:
                rules.filter(pk=rule.pk).update(**fields)
                changed += 1
    pd = after.mode == "pd"
    changed += rules.filter(key__in=PD_ONLY, enabled=not pd).update(enabled=pd)
    if pd:
        changed += ensure_rules(after, rule_model)
    return changed


def follow_plan(before: Any, after: Any, rule_model: Any) -> int:
    """After a plan edit, a ready-made threshold that still equals the old plan's number takes
    the new one; a threshold someone edited stays as they set it. A topology switch re-makes
    the rules for the new one (follow_topology)."""
    moved = follow_topology(before, after, rule_model)
    for key, field, scale in FROM_PLAN:
        old, new = getattr(before, field), getattr(after, field)
        if old == new:
            continue
        if field == "concurrency":
            old, new = max(1, old), max(1, new)
        moved += rule_model.objects.filter(deployment=after, key=key,
                                           threshold=old * scale).update(threshold=new * scale)
    return moved
