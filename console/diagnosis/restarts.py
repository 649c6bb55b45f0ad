"""Symptom 8, workers restart often: the process table's restart counts (since the deployment's
start), exit codes and the supervisor's last error, and the log lines of a dying engine."""

from __future__ import annotations

import signal

from console.alerts.symptom_links import RESTARTS
from console.diagnosis import log_patterns as logs
from console.diagnosis.observations import Observations
from console.diagnosis.symptoms import Cause, Diagnosis, Evidence, Fix, judge, log_evidence

# Restarts since the deployment's start that make the symptom present; one is suspected.
OFTEN = 3
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)
OOM_KINDS = (logs.OOM, logs.OOM_KILLED, logs.OOM_KV, logs.OOM_NO_CACHE, logs.CONTEXT_TOO_LONG)


def diagnose(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    config = memory = health = load = stall = 0.0
    restarted = [p for p in obs.processes if p.restarts]
    for process in restarted:
        code = "" if process.exit_code is None else f", last exit code {process.exit_code}"
        error = f": {process.last_error[:300]}" if process.last_error else ""
        evidence.append(Evidence(f"{process.slot} restarted {process.restarts} time(s) since the "
                                 f"deployment started ({process.state}{code}){error}", "process",
                                 process.started_at, process.log_url,
                                 strong=process.restarts >= OFTEN))
        never_ready = process.ready_at is None  # the supervisor clears it at every spawn
        if "wrote nothing" in process.last_error:
            stall += 3
        elif "health check failing" in process.last_error:
            health += 3
        elif process.exit_code in KILLED:
            memory += 3 if never_ready else 1
            if not never_ready:
                health += 1
        elif never_ready:
            config += 2
        else:
            load += 1
    if not restarted:
        return judge(RESTARTS, [], [])

    slots = {p.slot for p in restarted}
    for hit in obs.logs:
        if hit.slot not in slots:
            continue
        if hit.kind in OOM_KINDS:
            evidence.append(log_evidence(hit, strong=False))
            memory += 2
        elif hit.kind == logs.ENGINE_DEAD:
            evidence.append(log_evidence(hit, strong=False))
            load += 2
        elif hit.kind == logs.HEALTH_FAILING:
            evidence.append(log_evidence(hit, strong=False))
            health += 1
        elif hit.kind == logs.PORT_IN_USE:
            evidence.append(log_evidence(hit, strong=False))
            config += 3

    causes = [
        Cause("out-of-memory", "the worker runs out of memory, at start or under load (see "
              "'Out of memory at start')", memory, (
                  Fix("shrink the KV cache or context length", "plan:max_model_len"),
                  Fix("or serve a quantized variant", "plan:variant"))),
        Cause("start-config", "the worker exits during its start: the plan asks for something "
              "it cannot do (its last log line says what)", config, (
                  Fix("read its log, then correct the plan", "page:processes"),)),
        Cause("health-check", "the worker answers its health check too slowly under load and is "
              "taken out and restarted", health, (
                  Fix("cap the requests each worker takes so it keeps answering /health",
                      "plan:concurrency"),
                  Fix("or relax the supervisor's health and start thresholds "
                      "(PDSERVE_START_STALL_S)", "settings:PDSERVE_START_STALL_S"))),
        Cause("start-stall", "the worker wrote nothing for the start-stall time and was killed "
              "(a hung start, or a compile slower than the threshold on a loaded host)", stall, (
                  Fix("raise the start-stall threshold on a slow or loaded host",
                      "settings:PDSERVE_START_STALL_S"),)),
        Cause("engine-died", "the engine dies under load after it was ready", load, (
                  Fix("cap the batch (--max-num-seqs) and the concurrency each worker takes",
                      "plan:extra_engine_args"),)),
    ]
    return judge(RESTARTS, evidence, causes)
