"""Symptoms 5-7, the load family: heavy queueing at high concurrency, time to first token too
long, generation that stutters or stalls. All three read the collector's 1 s snapshots against
the plan's concurrency and SLOs."""

from __future__ import annotations

import statistics
from datetime import datetime

from console.alerts.symptom_links import QUEUEING, STALLS, TTFT_HIGH
from console.diagnosis import log_patterns as logs
from console.diagnosis.observations import Observations, Sample, mean, peak, per_sample
from console.diagnosis.symptoms import (
    Cause,
    Diagnosis,
    Evidence,
    Fix,
    alert_evidence,
    judge,
    log_evidence,
)

# The last minute decides whether a symptom is on now; five give the trend and the spikes.
NOW_S = 60
WINDOW_S = 300
KV_FULL = 0.9  # the ready-made rule's threshold: above it the engine preempts
NEAR_SLO = 0.8  # a latency this close to its SLO is suspected
STALL_S = 5  # running requests and no token generated for this long: a stall
BUSY_CPU = 95.0  # % of one core


def _span(points: list[tuple[datetime, float]]) -> str:
    return f"{points[0][0]:%H:%M:%S}-{points[-1][0]:%H:%M:%S}" if points else ""


# ---- 5: queueing ------------------------------------------------------------------------------
def queueing(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    capacity = kv_full = 0.0
    imbalance: dict[str, str] = {}  # role: its routing policy, where one instance queues alone
    plan = obs.plan
    last = obs.recent(NOW_S)
    roles = (plan.generator, "prefill") if plan.mode == "pd" else (plan.generator,)
    for role in roles:
        waiting = per_sample(last, "waiting", role)
        if not waiting:
            continue
        average = mean(v for _, v in waiting) or 0.0
        busy = sum(1 for _, v in waiting if v > 0) / len(waiting)
        third = max(1, len(waiting) // 3)
        growing = (mean(v for _, v in waiting[-third:]) or 0) > (
            mean(v for _, v in waiting[:third]) or 0) + 1
        top = peak(waiting)
        if average > plan.concurrency or (busy >= 0.8 and growing):
            evidence.append(Evidence(
                f"{average:.1f} requests wait on {role} on average over the last minute "
                f"(peak {top[1]:.0f} at {top[0]:%H:%M:%S}; the plan's concurrency is "
                f"{plan.concurrency})" + ("; the queue is growing" if growing else ""),
                "metrics", top[0], obs.metrics_url, strong=True))
            capacity += 3 if role == plan.generator else 2
        elif busy >= 0.5 and average >= 1:
            evidence.append(Evidence(f"requests waited on {role} in {busy:.0%} of the last "
                                     f"minute's seconds ({average:.1f} on average)", "metrics",
                                     top[0] if top else None, obs.metrics_url))
            capacity += 1
        policy = plan.prefill_policy if role == "prefill" else plan.decode_policy
        # Least outstanding already sends each request where the fewest are: a lasting skew
        # under it is the pool's size, which the capacity cause covers.
        if _imbalanced(last, role, evidence, obs.metrics_url) and policy != "least_outstanding":
            imbalance[role] = policy

    # vLLM runs far more requests at once than the plan sized the KV cache for (its own cap is
    # --max-num-seqs), so a flood shows first as requests in flight past the plan's slots.
    slots = plan.concurrency * max(1, plan.instances(plan.generator))
    in_flight = [(s.at, float(sum((s.processes.get("router", {}).get("in_flight") or {}).get(
        plan.generator, {}).values()))) for s in last if "router" in s.processes]
    flight = mean(v for _, v in in_flight)
    if flight is not None and flight > slots:
        top = peak(in_flight)
        evidence.append(Evidence(
            f"{flight:.0f} requests in flight to {plan.generator} on average over the last "
            f"minute (peak {top[1]:.0f} at {top[0]:%H:%M:%S}) for the plan's {slots} "
            f"({plan.instances(plan.generator)} instance(s) x concurrency {plan.concurrency})",
            "metrics", top[0], obs.metrics_url, strong=flight > 2 * slots))
        capacity += 2

    kv = per_sample(last, "kv_usage", plan.generator, max)
    kv_mean = mean(v for _, v in kv)
    if kv_mean is not None and kv_mean > KV_FULL:
        evidence.append(Evidence(f"{plan.generator}'s KV cache is {kv_mean:.0%} used on average "
                                 "over the last minute: the engine preempts and recomputes",
                                 "metrics", kv[-1][0], obs.metrics_url))
        kv_full += 2

    refused = sum(e.get("rps_by_status", {}).get("429", 0.0) or 0.0
                  for s in last for e in s.processes.values() if e.get("role") == "router"
                  and isinstance(e.get("rps_by_status"), dict))
    for alert in obs.alerts_of(QUEUEING):
        evidence.append(alert_evidence(alert))
        if alert.kind in ("kv_cache_full", "worker.kv_usage"):
            kv_full += 1
        else:
            capacity += 1

    generator = plan.generator
    causes = [
        Cause("capacity", f"more requests than the pool can run at once: {plan.instances(generator)} "
              f"{generator} instance(s) sized for {plan.concurrency} requests each", capacity, (
                  Fix("add instances (or let a pool policy add them)", "page:autoscaling"),
                  Fix("or raise the concurrency each worker is sized for", "plan:concurrency"))),
        Cause("kv-full", "the KV cache is full: running requests are preempted and queued again",
              kv_full, (Fix("give each worker a larger KV cache", "plan:kv_cache_gib"),
                        Fix("or a shorter context length", "plan:max_model_len"))),
        Cause("imbalance", "the router loads instances unevenly: one queues while another idles",
              2.0 * len(imbalance), tuple(
                  Fix(f"route {role} by least outstanding requests (now {policy})",
                      f"plan:{'prefill' if role == 'prefill' else 'decode'}_policy")
                  for role, policy in imbalance.items())),
        Cause("no-admission", "nothing limits what clients send, so a burst queues instead of "
              "being refused early", capacity * 0.5 if not refused else 0.0, (
                  Fix("set rate limits on the API keys at the gateway", "page:keys"),)),
    ]
    return judge(QUEUEING, evidence, causes)


def _imbalanced(samples: tuple[Sample, ...], role: str, evidence: list[Evidence],
                url: str) -> bool:
    by_slot: dict[str, list[float]] = {}
    for sample in samples:
        for slot, entry in sample.processes.items():
            if entry.get("role") == role and isinstance(entry.get("waiting"), int | float):
                by_slot.setdefault(slot, []).append(float(entry["waiting"]))
    if len(by_slot) < 2:
        return False
    means = {slot: statistics.fmean(values) for slot, values in by_slot.items()}
    busiest, idlest = max(means, key=means.__getitem__), min(means, key=means.__getitem__)
    if means[busiest] >= 2 and means[idlest] < 0.5:
        evidence.append(Evidence(f"{busiest} has {means[busiest]:.1f} requests waiting on "
                                 f"average while {idlest} has {means[idlest]:.1f}", "metrics",
                                 samples[-1].at, url))
        return True
    return False


# ---- 6: TTFT ----------------------------------------------------------------------------------
def ttft(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    prefill = handoff = decode_queue = policy = slow_prefill = 0.0
    plan = obs.plan
    last = obs.recent(NOW_S)
    points = per_sample(last, "ttft_p95", "router", max) or per_sample(
        last, "ttft_p95", plan.generator, max)
    average = mean(v for _, v in points)
    if average is not None and average > plan.ttft_slo_s * NEAR_SLO:
        over = average > plan.ttft_slo_s
        top = peak(points)
        evidence.append(Evidence(
            f"time to first token p95 averages {average:.2f} s over {_span(points)} (peak "
            f"{top[1]:.2f} s at {top[0]:%H:%M:%S}); the SLO is {plan.ttft_slo_s:g} s",
            "metrics", top[0], obs.metrics_url, strong=over))

    for alert in obs.alerts_of(TTFT_HIGH):
        evidence.append(alert_evidence(alert))
        if alert.kind == "prefill_queue":
            prefill += 2
    if not evidence:
        # Without a slow first token, queues are another symptom's evidence.
        return judge(TTFT_HIGH, [], [])

    if plan.mode == "pd":
        waiting = mean(v for _, v in per_sample(last, "waiting", "prefill"))
        if waiting:
            evidence.append(Evidence(f"{waiting:.1f} prompts wait on prefill on average over the "
                                     "last minute", "metrics", last[-1].at, obs.metrics_url))
            prefill += 2 + min(waiting, 5)
        backlog = _backlog_s(last)
        if backlog is not None and backlog > plan.ttft_slo_s / 2:
            evidence.append(Evidence(f"prefill's backlog is {backlog:.1f} s of prompt tokens at "
                                     "its measured speed", "metrics", last[-1].at,
                                     obs.metrics_url))
            prefill += 2
        # Peaks, not means: a minute holds few samples with prefill first tokens, and one slow
        # prompt's sample beside a few fast ones (a warm-up pair, a short prompt) averages
        # below the SLO while the router, which saw only the slow one, stays above it.
        engine = _top(per_sample(last, "ttft_p95", "prefill", max))
        if engine is not None and engine > plan.ttft_slo_s * NEAR_SLO:
            # Prefill's own first token past the SLO is the whole story of a slow first token
            # more often than a queue in front of it (a hung or starved prefill engine).
            slow_prefill += 3 if engine > plan.ttft_slo_s else 1.5
        hand = _top(per_sample(last, "handoff_p95", "router", max))
        # The hand-off is to blame for what it adds beyond prefill's own time, when that is
        # more than prefill's time itself: the two are percentiles of different histograms,
        # whose buckets differ by more than a quarter SLO once prefill is seconds slow.
        if hand is not None and engine is not None and hand - engine > max(
                plan.ttft_slo_s / 4, engine):
            evidence.append(Evidence(f"the KV hand-off adds ~{hand - engine:.2f} s beyond "
                                     "prefill's own time to first token", "metrics",
                                     last[-1].at, obs.metrics_url))
            handoff += 2
        if plan.pd_policy == "remote":
            policy += 0.5
    queued = mean(v for _, v in per_sample(last, "waiting", plan.generator))
    if queued:
        evidence.append(Evidence(f"{queued:.1f} requests wait on {plan.generator} on average "
                                 "over the last minute (see 'Heavy queueing')", "metrics",
                                 last[-1].at, obs.metrics_url))
        decode_queue += 1 + min(queued, 4)

    causes = [
        Cause("prefill-capacity", "prompts queue for the prefill pool: it lacks capacity for "
              "the prompt tokens arriving", prefill, (
                  Fix("add prefill instances", "page:autoscaling"),
                  Fix("or give prefill more cores", "plan:cpu_cores"))),
        Cause("slow-prefill", "each prompt takes long on prefill itself (long prompts, a slow "
              "variant)", slow_prefill, (
                  Fix("serve a compute-optimised (e.g. W8A8) variant on prefill",
                      "plan:variant"),)),
        Cause("decode-queue", f"requests wait on {plan.generator} before their first token",
              decode_queue, (Fix(f"add {plan.generator} instances", "page:autoscaling"),)),
        Cause("handoff", "the KV hand-off between prefill and decode is slow (see the KV "
              "transfer symptom)", handoff, (Fix("configure a faster KV channel",
                                                 "plan:kv_channel"),)),
        Cause("policy", "every prompt, however short, goes through the prefill pool first",
              policy, (Fix("let the router prefill short prompts on decode (adaptive)",
                           "plan:pd_policy"),)),
    ]
    return judge(TTFT_HIGH, evidence, causes)


def _top(points: list[tuple[datetime, float]]) -> float | None:
    top = peak(points)
    return None if top is None else top[1]


def _backlog_s(samples: tuple[Sample, ...]) -> float | None:
    if not samples:
        return None
    router = samples[-1].processes.get("router", {})
    tokens, speed = router.get("prefill_tokens_in_flight"), router.get("prefill_speed")
    if not tokens or not speed:
        return None
    return float(tokens) / float(speed)


# ---- 7: stalls --------------------------------------------------------------------------------
def stalls(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    interference = kv_full = bandwidth = cpu = hung = 0.0
    plan = obs.plan
    generator = plan.generator
    last, window = obs.recent(NOW_S), obs.recent(WINDOW_S)

    tpot = per_sample(last, "tpot_p95", generator, max)
    average = mean(v for _, v in tpot)
    if average is not None and average > plan.tpot_slo_s * NEAR_SLO:
        top = peak(tpot)
        evidence.append(Evidence(
            f"time per output token p95 on {generator} averages {average * 1000:.0f} ms over "
            f"{_span(tpot)} (peak {top[1] * 1000:.0f} ms at {top[0]:%H:%M:%S}); the SLO is "
            f"{plan.tpot_slo_s * 1000:.0f} ms", "metrics", top[0], obs.metrics_url,
            strong=average > plan.tpot_slo_s))
    typical = [v for _, v in per_sample(window, "tpot_p50", generator, max)]
    spikes = [(at, v) for at, v in per_sample(window, "tpot_p95", generator, max)
              if typical and v > 3 * statistics.median(typical) and v > plan.tpot_slo_s]
    if spikes:
        top = peak(spikes)
        evidence.append(Evidence(f"{len(spikes)} second(s) with token latency spikes over 3x "
                                 f"the typical {statistics.median(typical) * 1000:.0f} ms "
                                 f"(worst {top[1] * 1000:.0f} ms at {top[0]:%H:%M:%S})",
                                 "metrics", top[0], obs.metrics_url, strong=True))
    for slot, seconds, at in _stalled(window, generator):
        evidence.append(Evidence(f"{slot} ran requests but generated no token for {seconds:.0f} s "
                                 f"from {at:%H:%M:%S}", "metrics", at, obs.metrics_url,
                                 strong=True))
        # Seconds with no token at all outweigh prompts computed on decode (interference,
        # 2): a prefill chunk pauses streams for a step, not for STALL_S seconds.
        hung += 3
    for hit in obs.logs_of(logs.MID_STREAM):
        evidence.append(log_evidence(hit))
        hung += 1
    for alert in obs.alerts_of(STALLS):
        evidence.append(alert_evidence(alert))
    if not evidence:
        return judge(STALLS, [], [])

    prompt = mean(v for _, v in per_sample(window, "prompt_tps", generator))
    if plan.mode != "pd":
        interference += 2
    elif prompt:
        evidence.append(Evidence(f"{generator} also computes ~{prompt:.0f} prompt tokens/s "
                                 "itself: prefills interleave with its decoding", "metrics",
                                 window[-1].at, obs.metrics_url))
        interference += 2
    kv = mean(v for _, v in per_sample(window, "kv_usage", generator, max))
    if kv is not None and kv > KV_FULL:
        evidence.append(Evidence(f"{generator}'s KV cache is {kv:.0%} used: requests are "
                                 "preempted", "metrics", window[-1].at, obs.metrics_url))
        kv_full += 2
    running = mean(v for _, v in per_sample(window, "running", generator))
    if running is not None and running >= plan.concurrency:
        bandwidth += 2
    busy = mean(v for _, v in per_sample(window, "cpu", generator, max))
    if busy is not None and busy > BUSY_CPU:
        evidence.append(Evidence(f"{generator} used {busy:.0f}% of a core on average",
                                 "metrics", window[-1].at, obs.metrics_url))
        cpu += 1
    bandwidth += 0.5  # decode is memory-bandwidth bound: the standing remedy, ranked last

    causes = [
        Cause("prefill-interference", "prompts are computed on the generating workers and "
              "pause their streams", interference, (
                  Fix("prefill every prompt on the prefill pool", "plan:pd_policy"),
                  Fix("or lower how long a decode worker's streams may pause",
                      "plan:stall_budget_ms"))),
        Cause("kv-full", "a full KV cache preempts running requests, which recompute",
              kv_full, (Fix("give each worker a larger KV cache", "plan:kv_cache_gib"),)),
        Cause("hung-worker", "the decode engine stopped stepping (a hung or dying worker)",
              hung, (Fix("read its log; the health check's thresholds decide how soon it is "
                         "restarted", "page:processes"),)),
        Cause("cpu", "the generating worker is short of CPU (cores shared with another worker)",
              cpu, (Fix("give it cores of its own", "plan:cpu_cores"),)),
        Cause("bandwidth", "decode is memory-bandwidth bound: a large batch slows every token",
              bandwidth, (Fix("serve a bandwidth-optimised (smaller-weight) decode variant",
                              "plan:variant"),
                          Fix("or cap the requests a decode worker batches (--max-num-seqs)",
                              "plan:extra_engine_args"))),
    ]
    return judge(STALLS, evidence, causes)


def _stalled(samples: tuple[Sample, ...], role: str) -> list[tuple[str, float, datetime]]:
    """Slots that ran requests and generated nothing for STALL_S seconds or more in a row: an
    engine that steps no more, or a whole server that stopped answering (a stopped or hung
    process does not serve /metrics either) while it had requests running."""
    found = []
    slots = {slot for s in samples for slot, e in s.processes.items() if e.get("role") == role}
    for slot in sorted(slots):
        start = None
        longest: tuple[float, datetime] | None = None
        busy = False  # it ran requests when it last answered
        for sample in samples:
            entry = sample.processes.get(slot, {})
            if entry.get("up") == 0:
                stalled = busy
            else:
                busy = (entry.get("running") or 0) > 0
                stalled = busy and entry.get("gen_tps") == 0
            if stalled and start is None:
                start = sample.at
            elif not stalled:
                start = None
            if start is not None:
                seconds = (sample.at - start).total_seconds()
                if longest is None or seconds > longest[0]:
                    longest = (seconds, start)
        if longest is not None and longest[0] >= STALL_S:
            found.append((slot, longest[0], longest[1]))
    return found
