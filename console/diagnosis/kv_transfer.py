"""Symptom 2, prefill to decode KV transfer times out or fails: the router's failed hand-offs per
pair, NIXL's failed transfers, the KV load failures and expired leases vLLM logs, a slow
prefill-plus-hand-off."""

from __future__ import annotations

from console.alerts.symptom_links import KV_TRANSFER_TIMEOUT
from console.diagnosis import log_patterns as logs
from console.diagnosis.observations import Observations, mean, per_sample
from console.diagnosis.symptoms import (
    Cause,
    Diagnosis,
    Evidence,
    Fix,
    alert_evidence,
    check_evidence,
    judge,
    log_evidence,
)

WINDOW_S = 300
# The ready-made "KV hand-off slow" rule's threshold: the seed's example KV transfer timeout.
SLOW_HANDOFF_S = 0.5


def diagnose(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    handshake = storage = slow = prefill_gone = 0.0
    recent = obs.recent(WINDOW_S)

    failed: dict[tuple[str, str], int] = {}
    last_failure: dict[tuple[str, str], dict[str, str]] = {}
    handoff_errors = 0.0
    for sample in recent:
        router = sample.processes.get("router", {})
        for row in router.get("handoffs") or []:
            pair = (row.get("prefill_slot") or row.get("prefill", "?"),
                    row.get("decode_slot") or row.get("decode", "?"))
            failed[pair] = failed.get(pair, 0) + int(row.get("failed_now") or 0)
            if row.get("last_failure"):
                last_failure[pair] = row["last_failure"]
        handoff_errors += (router.get("backend_errors_ps") or {}).get("decode kv_handoff", 0.0)
    for (prefill, decode), count in failed.items():
        if count:
            failure = last_failure.get((prefill, decode)) or {}
            evidence.append(Evidence(
                f"{count} hand-off(s) {prefill} -> {decode} failed in the last {WINDOW_S // 60} "
                f"minutes" + (f"; the last: {failure.get('error')}" if failure else ""),
                "metrics", recent[-1].at, obs.metrics_url, strong=True))
            # Failures say that the hand-off broke, not why: the generic cause, a fixed weight.
            slow += 2
    if handoff_errors and not any(failed.values()):
        evidence.append(Evidence(f"decode could not load prefill's KV ~{handoff_errors:.0f} time(s) "
                                 f"in the last {WINDOW_S // 60} minutes (router: kv_handoff "
                                 "errors)", "metrics", recent[-1].at, obs.metrics_url,
                                 strong=True))
        slow += 2

    nixl_failed = sum(v for _, v in per_sample(recent, "nixl_failed_ps", "decode")) + sum(
        v for _, v in per_sample(recent, "nixl_failed_ps", "prefill"))
    if nixl_failed:
        evidence.append(Evidence(f"NIXL counted ~{nixl_failed:.0f} failed transfer(s) in the "
                                 f"last {WINDOW_S // 60} minutes", "metrics", recent[-1].at,
                                 obs.metrics_url, strong=True))
        slow += 2

    # The hand-off alone (prefill's answer to decode's first token): "prefill plus hand-off"
    # held a 1,000-token prompt's prefill, half a second of SmolLM2 on a CPU core, and made a
    # healthy pair's verification look like a slow channel.
    handoff = mean(v for _, v in per_sample(recent, "kv_handoff_p95", "router", max))
    if handoff is not None and handoff > SLOW_HANDOFF_S:
        evidence.append(Evidence(f"KV hand-off p95 (prefill's answer to decode's first token) "
                                 f"averages {handoff:.2f} s over the last {WINDOW_S // 60} "
                                 f"minutes (more than {SLOW_HANDOFF_S} s)",
                                 "metrics", recent[-1].at, obs.metrics_url))
        slow += 1
    xfer = mean(v for _, v in per_sample(recent, "nixl_xfer_p50", "decode", max))
    if xfer is not None and xfer > SLOW_HANDOFF_S:
        evidence.append(Evidence(f"NIXL transfer time p50 averages {xfer:.2f} s", "metrics",
                                 recent[-1].at, obs.metrics_url))
        slow += 2

    for hit in obs.logs_of(logs.KV_HANDSHAKE):
        evidence.append(log_evidence(hit))
        handshake += 3
    for hit in obs.logs_of(logs.KV_NOT_SAVED):
        evidence.append(log_evidence(hit))
        storage += 3
    for hit in obs.logs_of(logs.KV_EXPIRED, logs.KV_LOAD_FAILED, logs.KV_TRANSFER_FAILED,
                           logs.KV_HANDOFF_FAILED):
        evidence.append(log_evidence(hit))
        slow += 1

    for check in obs.checks_of("nixl.compat", "engine.connector"):
        evidence.append(check_evidence(check))
        handshake += 3 if check.severity == "error" else 1

    for alert in obs.alerts_of(KV_TRANSFER_TIMEOUT):
        evidence.append(alert_evidence(alert))
        slow += 1

    # A prefill that restarted while decode still held its transfer parameters: the blocks
    # decode was told to pull are gone.
    if evidence:
        for process in obs.processes:
            if process.role == "prefill" and process.restarts and process.started_at and (
                    obs.now - process.started_at).total_seconds() <= WINDOW_S:
                evidence.append(Evidence(f"{process.slot} restarted at "
                                         f"{process.started_at:%H:%M:%S} (restart "
                                         f"{process.restarts})", "process", process.started_at,
                                         process.log_url))
                prefill_gone += 2

    plan = obs.plan
    # Already recomputing, decode fails no request for a missing KV: nothing more to set there.
    recompute = () if plan.kv_load_failure == "recompute" else (
        Fix("let decode recompute a prompt whose KV does not arrive instead of failing the "
            "request", "plan:kv_load_failure"),)
    causes = [
        Cause("handshake", "prefill and decode cannot agree on the KV layout: NIXL's "
              "compatibility hash (model path, dtype, KV heads, block size) differs", handshake, (
                  Fix("serve both roles from the same model path and KV cache dtype",
                      "plan:variant"),
                  Fix("or use the shared-storage channel, which matches on prompt tokens only",
                      "plan:kv_channel"))),
        Cause("storage", "the shared-storage channel cannot write KV files (space in "
              "/dev/shm, permissions): decode computes prompts itself or fails", storage, (
                  Fix("free space in the KV directory, or switch the KV channel",
                      "plan:kv_channel"),)),
        Cause("slow-channel", f"the {plan.kv_channel} channel moves KV too slowly for decode's "
              "load timeout and prefill's lease: the hand-off expires before decode reads it",
              slow, (
                  Fix("give the KV channel more bandwidth: NIXL with RDMA/cuda_ipc transports "
                      "between nodes, prefill and decode on one node for shared storage",
                      "plan:kv_channel"),
                  *recompute)),
        Cause("prefill-gone", "the prefill worker restarted between the prefill and decode's "
              "read, taking the KV blocks with it", prefill_gone, (
                  Fix("see 'Workers restart often' for why it restarts", "page:processes"),)),
    ]
    return judge(KV_TRANSFER_TIMEOUT, evidence, causes)
