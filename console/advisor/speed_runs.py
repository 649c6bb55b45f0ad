"""Measuring one variant's speeds on a node, on demand, for the advisor: a Celery task asks the
supervisor (console/supervisor/process_requests.py), which alone spawns processes, first for the
variant's vLLM server (and, on a node of two cores or more, a second one on another core, the
neighbour whose steps slow the first's) and then for ``python -m inference.advisor measure``
against them. The task follows the measurement's log into the row (its progress) and stores the
speeds it prints."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from console.advisor.models import SpeedProfile
from console.audit.entries import record, snapshot
from console.catalog.models import Variant
from console.celery import app, queue_or_mark
from console.fleet.models import Node
from console.quality.servers import served
from console.supervisor import process_requests
from console.supervisor.models import ManagedProcess
from console.supervisor.process_requests import ProcessFailed
from console.supervisor.worker_keys import process_key
from inference.launch import LaunchError
from inference.output_gate import SERVER_START_TIMEOUT_S, ReferenceServer

log = logging.getLogger("pdserve.advisor")
State = SpeedProfile.State
# Every server measured gets this long to prove it is done (the CLI's whole sweep).
MEASURE_TIMEOUT_S = 1800.0
POLL_S = 0.5
STALE_AFTER_S = MEASURE_TIMEOUT_S + SERVER_START_TIMEOUT_S + 600
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class MeasureRefused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def queue(node: Node, variant: Variant, user: AbstractBaseUser | None) -> SpeedProfile:
    if not node.is_local:
        raise MeasureRefused("node", f"{node.name}: pdserve starts vLLM only on the local node "
                                     "until node agents exist")
    if not variant.inspected:
        raise MeasureRefused("variant", f"{variant} has not been inspected")
    # A run older than its longest possible duration lost its Celery worker: it blocks nothing.
    since = timezone.now() - timedelta(seconds=STALE_AFTER_S)
    if SpeedProfile.objects.filter(node=node, variant=variant, created__gte=since,
                                   state__in=(State.QUEUED, State.RUNNING)).exists():
        raise MeasureRefused("variant", f"{variant} is already being measured on {node.name}")
    with transaction.atomic():
        profile = SpeedProfile.objects.create(node=node, variant=variant,
                                              requested_by=user if user and user.pk else None)
        record("advisor.measure", profile, after=snapshot(profile, ("node", "variant")))
    transaction.on_commit(partial(_send, profile.pk))
    return profile


def _send(profile_id: int) -> None:
    queue_or_mark(measure_speeds, profile_id, SpeedProfile.objects.all(), state=State.FAILED)


@app.task(name="advisor.measure_speeds", ignore_result=True)
def measure_speeds(profile_id: int) -> None:
    run(profile_id)


def run(profile_id: int) -> SpeedProfile:
    if not SpeedProfile.objects.filter(pk=profile_id, state=State.QUEUED).update(state=State.RUNNING):
        return SpeedProfile.objects.get(pk=profile_id)
    profile = SpeedProfile.objects.select_related("node", "variant").get(pk=profile_id)
    try:
        fields: dict[str, Any] = {"speeds": _measure(profile), "state": State.DONE}
    except (LaunchError, ProcessFailed, OSError, httpx.HTTPError, MeasureRefused) as exc:
        fields = {"state": State.FAILED, "error": str(exc)[:1000]}
    except Exception as exc:  # the row must not stay "running", whatever happened
        log.exception("speed measurement #%d crashed", profile_id)
        fields = {"state": State.FAILED, "error": f"the measurement crashed: {exc!r}"[:1000]}
    SpeedProfile.objects.filter(pk=profile_id).update(finished_at=timezone.now(), **fields)
    profile.refresh_from_db()
    return profile


def kv_bytes_per_token(variant: Variant, dtype: str) -> int | None:
    """K and V of every layer for one token, from the model's config.json; None when it does
    not say (then no hand-off is measured)."""
    try:
        config = json.loads((Path(variant.path) / "config.json").read_text())
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return 2 * layers * heads * head_dim * DTYPE_BYTES.get(dtype, 2)


def _measure(profile: SpeedProfile) -> dict[str, Any]:
    node, variant = profile.node, profile.variant
    log_dir = Path(settings.PDSERVE_LOG_DIR) / "advisor"
    log_dir.mkdir(parents=True, exist_ok=True)
    dtype = "bfloat16"
    # One core of the node, as the variant measurements use: one server's speeds. A second
    # server on another core is the neighbour whose steps slow this one's (speeds.py).
    cores = list(node.cpu_ids[-2:]) if node.cpu_ids else []

    def server(core: int | None, name: str) -> AbstractContextManager[ManagedProcess]:
        spec = ReferenceServer(model_path=variant.path, port=0, dtype=dtype,
                               cores=(core,) if core is not None else (),
                               cache_dir=str(settings.PDSERVE_CACHE_DIR),
                               enforce_eager=settings.PDSERVE_ENFORCE_EAGER)
        return served(spec, ManagedProcess.Kind.MEASUREMENT, f"advisor-{profile.pk}-{name}",
                      log_dir / f"{profile.pk}-{name}.log")

    with ExitStack() as stack:
        process = stack.enter_context(server(cores[-1] if cores else None, "server"))
        neighbour = (stack.enter_context(server(cores[0], "neighbour")) if len(cores) > 1
                     else None)
        key_file = stack.enter_context(_key_file(log_dir / f"{profile.pk}.key", process))
        neighbour_key = (stack.enter_context(_key_file(log_dir / f"{profile.pk}-neighbour.key",
                                                       neighbour))
                         if neighbour is not None else None)
        return _run_cli(profile, process.url, key_file, kv_bytes_per_token(variant, dtype),
                        log_dir / f"{profile.pk}-measure.log",
                        (neighbour.url, neighbour_key) if neighbour and neighbour_key else None)


@contextmanager
def _key_file(path: Path, process: ManagedProcess) -> Iterator[Path]:
    # Created 0600 before the key is written: the key never sits in a readable file.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(process_key(process) or "")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _run_cli(profile: SpeedProfile, url: str, key_file: Path, kv_bytes: int | None,
             log_path: Path, neighbour: tuple[str, Path] | None = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "inference.advisor", "measure", "--url", url,
            "--key-file", str(key_file)]
    if neighbour is not None:
        argv += ["--neighbour-url", neighbour[0], "--neighbour-key-file", str(neighbour[1])]
    if kv_bytes:
        argv += ["--kv-dir", str(Path(settings.PDSERVE_KV_DIR) / "advisor-measure"),
                 "--kv-bytes-per-token", str(kv_bytes)]
    log_path.unlink(missing_ok=True)
    row = process_requests.request(ManagedProcess.Kind.MEASUREMENT, f"advisor-{profile.pk}-measure",
                                   argv, {"PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1"},
                                   log_path, port=None, role="advisor")
    deadline = time.monotonic() + MEASURE_TIMEOUT_S
    try:
        while True:
            events = read_events(log_path)
            SpeedProfile.objects.filter(pk=profile.pk).update(
                progress=[e for e in events if e.get("event") == "progress"])
            row.refresh_from_db()
            if row.state == ManagedProcess.State.FAILED:
                raise ProcessFailed(f"the measurement failed: {row.last_error}")
            if process_requests.ended(row):
                break  # it exited
            if time.monotonic() > deadline:
                raise ProcessFailed(f"the measurement did not finish within {MEASURE_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
    finally:
        process_requests.release(row)
    events = read_events(log_path)
    for event in reversed(events):
        if event.get("event") == "result":
            return dict(event["speeds"])
        if event.get("event") == "error":
            raise MeasureRefused("measurement", str(event.get("message")))
    raise ProcessFailed(f"the measurement exited with code {row.exit_code} and printed no result "
                        f"(log: {log_path})")


def read_events(log_path: Path) -> list[dict[str, Any]]:
    """The CLI's JSON event lines among its log's lines (a log holds other output too)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        if line.startswith('{"event"'):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line still being written; the next read has it whole
    return events
