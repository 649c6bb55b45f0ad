"""Connectivity: every planned port answers; each worker's /health and /v1/models; the
router's /health and its view of the backends; a real request through every prefill/decode
pair, told apart by the router's timeline line of each request."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx

from console.deployments.models import Deployment
from console.gateway.router_admin import AdminUnreadable, pool_members
from console.supervisor.models import ManagedProcess
from console.verification.subject import Subject
from console.verification.verdicts import FAIL, PASS, WARN, Section
from inference.router.asked_placement import PLACEMENT_HEADER
from inference.worker_auth import bearer

TIMEOUT_S = 5.0
# The router writes a request's timeline line when it ends; the log capture may lag behind.
TIMELINE_WAIT_S = 5.0
TIMELINE_PREFIX = "timeline {"
PAIR_MAX_TOKENS = 4


def port_open(host: str, port: int, timeout_s: float = 2.0) -> str:
    """"" when something accepts a connection at host:port, else the error."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _port(url: str) -> int | None:
    return urlsplit(url).port


def check_ports(subject: Subject, section: Section) -> None:
    endpoints = [(e.slot, e.host, e.port) for e in (*subject.workers, subject.router)]
    for slot, host, port in endpoints:
        error = port_open(host, port)
        section.add(f"port {slot}", FAIL if error else PASS,
                    f"{slot}: {host}:{port} " + (f"does not answer ({error})" if error
                                                 else "accepts connections"),
                    host=host, port=port, error=error)
    # NIXL's side channel listens only once its engine is up; a closed one shows as a KV
    # warm-up failure too, so it warns rather than fails here.
    for slot, host, port in subject.side_channels:
        error = port_open(host, port)
        section.add(f"side channel {slot}", WARN if error else PASS,
                    f"{slot}: side channel {host}:{port} "
                    + (f"does not answer ({error})" if error else "accepts connections"),
                    host=host, port=port, error=error)


def check_workers(subject: Subject, section: Section, client: httpx.Client) -> None:
    for worker in subject.workers:
        try:
            health = client.get(f"{worker.url}/health")
            models = client.get(f"{worker.url}/v1/models", headers=bearer(subject.worker_key))
        except httpx.HTTPError as exc:
            section.add(f"worker {worker.slot}", FAIL,
                        f"{worker.slot}: {type(exc).__name__}: {exc}", url=worker.url)
            continue
        served = _model_ids(models)
        if health.status_code != 200:
            verdict, detail = FAIL, f"{worker.slot}: /health answered {health.status_code}"
        elif models.status_code != 200:
            verdict, detail = FAIL, f"{worker.slot}: /v1/models answered {models.status_code}"
        elif not served:
            verdict, detail = FAIL, f"{worker.slot}: /v1/models lists no model"
        else:
            verdict, detail = PASS, f"{worker.slot}: healthy, serves {', '.join(served)}"
        section.add(f"worker {worker.slot}", verdict, detail, url=worker.url,
                    health_status=health.status_code, models_status=models.status_code,
                    models=served)


def _model_ids(response: httpx.Response) -> list[str]:
    if response.status_code != 200:
        return []
    try:
        return [str(m["id"]) for m in response.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def check_router(deployment: Deployment, subject: Subject, section: Section,
                 client: httpx.Client) -> None:
    try:
        response = client.get(f"{subject.router_url}/health")
        health: dict[str, Any] = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        section.add("router health", FAIL, f"router /health: {type(exc).__name__}: {exc}",
                    url=subject.router_url)
        return
    status = health.get("status")
    verdict = PASS if status == "ok" else WARN if status == "degraded" else FAIL
    section.add("router health", verdict, f"router /health: {status}",
                url=subject.router_url, roles=health.get("roles"),
                kv_warmup=health.get("kv_warmup"))
    try:
        members = pool_members(deployment, timeout_s=TIMEOUT_S)
    except AdminUnreadable as exc:
        section.add("router backends", FAIL, f"router admin: {exc}")
        return
    listed = {_port(m.url): m for m in members}
    for worker in subject.workers:
        member = listed.get(worker.port)
        if member is None:
            section.add(f"router sees {worker.slot}", FAIL,
                        f"the router does not list {worker.slot} ({worker.url})")
        else:
            section.add(f"router sees {worker.slot}", PASS if member.state == "ready" else FAIL,
                        f"the router lists {worker.slot} as {member.state}",
                        url=member.url, state=member.state, revision=member.revision)


def check_pairs(subject: Subject, section: Section, client: httpx.Client, report_id: int) -> None:
    """Requests through the router until every prefill/decode pair has served one (or as many
    tries as twice the pairs): which pair served is in the router's timeline line. Each names
    its placement (X-Pdserve-Placement: remote), so that the router hands it from prefill to
    decode whatever its policy would do with a prompt of that length."""
    pairs = subject.pairs()
    tries = max(2 * len(pairs), 1)
    prefix = f"verify-{report_id}-{uuid.uuid4().hex[:6]}-pair-"
    failures: list[str] = []
    for n in range(tries):
        try:
            response = client.post(
                f"{subject.router_url}/v1/completions",
                headers={**bearer(subject.api_key), "X-Request-Id": f"{prefix}{n}",
                         PLACEMENT_HEADER: "remote"},
                json={"model": subject.model, "prompt": _handoff_prompt(n, subject.max_model_len),
                      "max_tokens": PAIR_MAX_TOKENS, "temperature": 0})
            if response.status_code != 200:
                failures.append(f"{prefix}{n}: HTTP {response.status_code} {response.text[:200]}")
        except httpx.HTTPError as exc:
            failures.append(f"{prefix}{n}: {type(exc).__name__}: {exc}")
    if failures:
        section.add("requests through the router", FAIL,
                    f"{len(failures)} of {tries} requests through the router failed",
                    errors=failures[:5])
    else:
        section.add("requests through the router", PASS,
                    f"{tries} requests through the router answered")
    if not pairs:
        return
    timelines = _timelines(subject, prefix, tries)
    served = {(_port(t.get("prefill") or ""), _port(t.get("decode") or "")) for t in timelines}
    missing = [f"{p} -> {d}" for p, d in pairs if (_port(p), _port(d)) not in served]
    evidence = {"request_ids": [t.get("request_id") for t in timelines],
                "served": sorted(f"{t.get('prefill')} -> {t.get('decode')}" for t in timelines)}
    if not timelines:
        section.add("every pair served", WARN,
                    "no router timeline line found for the requests: which pair served is "
                    "unknown", **evidence)
    elif missing:
        # The router's policies chose the pairs; an unused pair is not known to be broken.
        section.add("every pair served", WARN,
                    f"{len(missing)} of {len(pairs)} pairs served none of {tries} requests: "
                    f"{', '.join(missing)}", missing=missing, **evidence)
    else:
        section.add("every pair served", PASS, f"all {len(pairs)} prefill/decode pairs served "
                    "a request", **evidence)


def _handoff_prompt(n: int, max_model_len: int) -> str:
    """A prompt of several KV blocks (about 512 tokens, or a quarter of the context), which a
    KV channel has something to move for."""
    lines = max(2, min(512, max_model_len // 4) // 10)
    return " ".join(f"Hand-off check {n}, line {i}: the sky is blue." for i in range(lines))


def _timelines(subject: Subject, prefix: str, count: int) -> list[dict[str, Any]]:
    """The router's timeline lines of the requests named ``prefix<n>``, from its log file."""
    router = (ManagedProcess.objects.filter(pk=subject.router.process_id).first()
              if subject.router.process_id else None)
    if router is None:
        return []
    deadline = time.monotonic() + TIMELINE_WAIT_S
    found: dict[str, dict[str, Any]] = {}
    while True:
        for line in router.tail(lines=4000, max_bytes=1 << 20):
            marker = line.find(TIMELINE_PREFIX)
            if marker < 0 or prefix not in line:
                continue
            try:
                parsed = json.loads(line[marker + len(TIMELINE_PREFIX) - 1:])
            except ValueError:
                continue
            if isinstance(parsed, dict) and str(parsed.get("request_id", "")).startswith(prefix):
                found[parsed["request_id"]] = parsed
        if len(found) >= count or time.monotonic() > deadline:
            return list(found.values())
        time.sleep(0.25)


def connectivity(deployment: Deployment, subject: Subject, report_id: int) -> Section:
    section = Section("connectivity")
    check_ports(subject, section)
    with httpx.Client(timeout=TIMEOUT_S) as client:
        check_workers(subject, section, client)
        check_router(deployment, subject, section, client)
    with httpx.Client(timeout=httpx.Timeout(120.0, connect=TIMEOUT_S)) as client:
        check_pairs(subject, section, client, report_id)
    return section
