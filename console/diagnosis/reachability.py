"""Symptom 1, the router cannot reach a backend: the router's failed calls, a backend out of
its rotation or down in the collector's snapshots, a planned port someone else holds."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from console.alerts.symptom_links import BACKEND_UNREACHABLE
from console.diagnosis import log_patterns as logs
from console.diagnosis.observations import Observations
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

# Router error kinds (inference/router/calls.py: the exception's class name) that mean the
# backend was not reached at all, as opposed to a slow or failing answer.
UNREACHED = ("ClientConnectorError", "ClientConnectorDNSError", "ServerDisconnectedError",
             "ClientOSError", "ConnectionRefusedError")
# A worker down this long in a row, with the router up, is out of reach rather than restarting.
DOWN_FOR_S = 10
WINDOW_S = 300
# The supervisor may respawn a killed worker just before the router logs losing it.
RESTART_SLACK = timedelta(seconds=30)


def diagnose(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    port_taken = down = address = drift = 0.0

    unreached: dict[str, float] = {}
    last_at = None
    for sample in obs.recent(WINDOW_S):
        errors = sample.processes.get("router", {}).get("backend_errors_ps") or {}
        for kind_key, rate in errors.items():
            role, _, kind = kind_key.partition(" ")
            if kind in UNREACHED and rate:
                unreached[kind_key] = unreached.get(kind_key, 0.0) + rate
                last_at = sample.at
    streaks = _down_streaks(obs) if obs.plan.running else []
    down_roles = {obs.process(slot).role for slot, _, _ in streaks if obs.process(slot)} | {
        p.role for p in obs.processes if p.role != "router" and p.state != "ready"}
    for kind_key, total in unreached.items():
        role, _, kind = kind_key.partition(" ")
        evidence.append(Evidence(f"the router's calls to {role} failed with {kind}: "
                                 f"~{total:.0f} in the last {WINDOW_S // 60} minutes", "metrics",
                                 last_at, obs.metrics_url, strong=True))
        # Refused calls to a worker that is up and ready mean the router calls the wrong place.
        if role in down_roles:
            down += 2
        else:
            address += 3

    router = obs.process("router")
    if router is not None and router.degraded:
        evidence.append(Evidence(f"the router serves without {router.degraded}: no "
                                 f"{router.degraded} worker answers it", "process",
                                 router.started_at, router.log_url, strong=True))
        down += 1

    if router is not None and router.state == "ready":
        for slot, seconds, at in streaks:
            process = obs.process(slot)
            evidence.append(Evidence(
                f"{slot} has not answered /metrics for {seconds:.0f} s"
                + (f" (state {process.state})" if process else ""), "metrics", at,
                process.log_url if process else obs.metrics_url, strong=True))
            down += 1

    for hit in obs.logs_of(logs.OUT_OF_ROTATION, logs.CONNECT_FAILED):
        recent = (obs.now - hit.at).total_seconds() <= WINDOW_S
        evidence.append(log_evidence(hit, strong=recent))
        if recent:
            # A worker of the role the router lost that is down or started again since: it
            # was the backend that went away; none: the router called where nothing listens.
            if _went_away(obs, hit.text, hit.at):
                down += 1
            else:
                address += 1
    for hit in obs.logs_of(logs.PORT_IN_USE):
        evidence.append(log_evidence(hit))
        # The worker's own words for why it could not listen: it outranks the rest.
        port_taken += 5

    failing = bool(obs.failing())
    for check in obs.checks_of("port.bound", "port.conflict"):
        evidence.append(check_evidence(check, failing))
        if "drift" in check.message or "runs on port" in check.message:
            drift += 2
        else:
            port_taken += 3 if check.severity == "error" else 1
    for check in obs.checks_of("node.reach", "node.agent"):
        evidence.append(check_evidence(check))
        address += 3 if check.severity == "error" else 1

    for alert in obs.alerts_of(BACKEND_UNREACHABLE):
        evidence.append(alert_evidence(alert))
        if alert.kind in ("port_foreign", "deployment.foreign_ports"):
            port_taken += 3
        elif alert.kind in ("node_down", "deployment.node_down"):
            address += 2
        else:
            down += 1

    causes = [
        Cause("port-taken", "a planned port is held by another process, so the worker cannot "
              "bind it (or the router reaches the wrong server)", port_taken, (
                  Fix("stop the process holding the port, or give the worker a free port in "
                      "the plan", "plan:ports"),)),
        Cause("backend-down", "the backend process is down or restarting: the router has "
              "nothing to call", down, (
                  Fix("read the worker's log and process state; see 'Workers restart often' "
                      "below", "page:processes"),
                  Fix("start the deployment again once the cause is fixed", "page:start"))),
        Cause("address", "the router calls an address or port where nothing listens: a wrong "
              "host or port in the plan, a node that cannot reach the other, a firewall",
              address, (
                  Fix("check each worker's host (its node's address, never 0.0.0.0) and port",
                      "plan:ports"),
                  Fix("check that the nodes reach each other (node.reach)", "page:nodes"))),
        Cause("drift", "a worker runs on another port than the plan says (the plan changed "
              "while it ran)", drift, (Fix("restart the deployment to apply the plan",
                                           "page:start"),)),
    ]
    return judge(BACKEND_UNREACHABLE, evidence, causes)


def _went_away(obs: Observations, line: str, at: datetime) -> bool:
    """Whether a worker of the role named in the router's log ``line`` is not ready, or was
    (re)started around or after ``at``."""
    for process in obs.processes:
        if process.role == "router" or not re.search(rf"\b{process.role} http", line):
            continue
        if process.state != "ready" or (process.restarts and process.started_at is not None
                                        and process.started_at >= at - RESTART_SLACK):
            return True
    return False


def _down_streaks(obs: Observations) -> list[tuple[str, float, datetime]]:
    """Worker slots whose latest snapshots say ``up: 0`` for at least DOWN_FOR_S seconds."""
    streaks = []
    samples = obs.recent(WINDOW_S)
    if not samples:
        return []
    slots = {slot for s in samples for slot, e in s.processes.items() if e.get("role") != "router"}
    for slot in sorted(slots):
        first_down = None
        for sample in reversed(samples):
            entry = sample.processes.get(slot)
            if entry is None or entry.get("up") != 0:
                break
            first_down = sample.at
        if first_down is not None:
            seconds = (samples[-1].at - first_down).total_seconds()
            if seconds >= DOWN_FOR_S:
                streaks.append((slot, seconds, first_down))
    return streaks
