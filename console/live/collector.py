"""The metrics collector: once a second, every live process's /metrics, CPU and memory.

It runs in the supervisor, which knows the live processes. Each step scrapes them, keeps the
raw text (the console's own /metrics re-exports it), stores one compact snapshot per deployment
and then broadcasts it: store first, broadcast after, like log lines.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.fleet import agent_liveness
from console.live import gateway_scrape
from console.live.broadcast import metric_messages, send_all
from console.live.downsample import floor_minute, prune, roll_up
from console.live.models import MetricSample, ProcessScrape
from console.live.periodic import Periodic
from console.live.resources import TreeUsage
from console.supervisor.models import ManagedProcess
from console.supervisor.worker_keys import process_key
from inference.prom_snapshot import Scrape, parse, process_stats
from inference.worker_auth import bearer

log = logging.getLogger("pdserve.metrics")


@dataclass(frozen=True)
class ScrapeTarget:
    """A live child of the supervisor: its process row and the pid of its group leader."""

    record_id: int
    pid: int
    # Where it runs when not on this node: a node agent's node, whose heartbeat carries its
    # CPU and memory (its pid means nothing here); its /metrics are scraped over the network.
    node: str | None = None


RAW_EVERY_S = 5.0


@dataclass(frozen=True)
class _Previous:
    pid: int
    scrape: Scrape


class MetricsCollector:
    def __init__(self, targets: Callable[[], Iterable[ScrapeTarget]], interval_s: float = 1.0,
                 timeout_s: float = 0.5, raw_every_s: float = RAW_EVERY_S) -> None:
        self.targets = targets
        self.interval_s = interval_s
        self.raw_every_s = raw_every_s
        self.http = httpx.Client(timeout=timeout_s)
        self._previous: dict[int, _Previous] = {}
        self._redis: redis.Redis | None = None
        self._usage = TreeUsage()
        self._last_failure: dict[tuple[int, str, str], dict[str, str]] = {}
        self._maintained: datetime | None = None
        self._raw_stored: datetime | None = None
        self._gateways: dict[str, gateway_scrape.GatewayScrape] = {}  # by replica slot
        self._loop = Periodic("metrics-collector", interval_s, self.collect_once, log,
                              "collecting metrics failed; retrying", self.http.close)

    # ---- one step ------------------------------------------------------------------------
    def collect_once(self) -> list[MetricSample]:
        """Scrape every target, store the raw texts and one sample per deployment, broadcast."""
        targets = {target.record_id: target for target in self.targets()}
        records = ManagedProcess.objects.filter(pk__in=list(targets)).select_related(
            "deployment").order_by("deployment", "slot")
        now = timezone.now()
        texts: dict[int, str] = {}
        by_deployment: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
        ports: dict[int, dict[int, str]] = defaultdict(dict)
        remote = self._remote_resources({t.node for t in targets.values() if t.node})
        for record in records:
            target = targets[record.pk]
            pid = target.pid
            entry: dict[str, Any] = {"role": record.role}
            # A worker answers /metrics only with its key (inference/worker_auth.py).
            text = self._fetch(record.url, process_key(record))
            if text is None:
                entry["up"] = 0
                self._previous.pop(record.pk, None)
            else:
                entry["up"] = 1
                texts[record.pk] = text
                entry.update(self._stats(record.pk, pid, record.role, text))
            entry.update(self._usage.measure(pid) if target.node is None else
                         remote.get(str(record.pk), {"cpu": None, "rss": None}))
            by_deployment[record.deployment_id][record.slot] = entry
            ports[record.deployment_id][record.port] = record.slot
        self._usage.forget_unseen()
        for record_id in set(self._previous) - set(targets):
            del self._previous[record_id]
        names = {record.deployment_id: record.deployment.name for record in records}
        gateway = self._gateway_stats()
        for deployment_id, processes in by_deployment.items():
            self._annotate_handoffs(deployment_id, processes, ports[deployment_id], now)
            # Beside the router's own numbers: the router is what the gateway forwards to.
            if "router" in processes and names[deployment_id] in gateway:
                processes["router"].update(gateway[names[deployment_id]])
        samples = self._store(now, texts, by_deployment)
        if settings.REDIS_URL and samples:
            # Shared channel layer: broadcast right after storing. Without Redis the console's
            # hub polls the stored rows (console/live/hub.py).
            async_to_sync(send_all)(metric_messages(samples))
        self.maintain(now)
        return samples

    def maintain(self, now: datetime) -> bool:
        """Once a minute: roll the last minutes' 1 s samples up and apply retention."""
        minute = floor_minute(now)
        if self._maintained is not None and minute <= self._maintained:
            return False
        roll_up(now)
        prune(now)
        self._maintained = minute
        return True

    # ---- the thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop(timeout_s=10)

    # ---- helpers -------------------------------------------------------------------------
    def _fetch(self, url: str, key: str | None = None) -> str | None:
        try:
            response = self.http.get(f"{url}/metrics", headers=bearer(key))
        except httpx.HTTPError:
            return None  # starting, stopping or hung: the snapshot says "up": 0
        return response.text if response.status_code == 200 else None

    def _gateway_stats(self) -> dict[str, dict[str, float | None]]:
        """Per deployment name, what the gateway replicas running on this node say of it,
        summed; {} when none is ready (off, starting, or this is a node agent)."""
        replicas = ManagedProcess.objects.filter(
            kind=ManagedProcess.Kind.GATEWAY, state=ManagedProcess.State.READY,
        ).exclude(pid__isnull=True)
        current: dict[str, gateway_scrape.GatewayScrape] = {}
        stats = []
        for replica in replicas:
            text = self._fetch(replica.url)
            if text is None or replica.pid is None:
                continue
            try:
                scrape = gateway_scrape.parse(text, replica.pid, time.monotonic())
            except ValueError:
                log.warning("gateway %s served unparsable metrics", replica.slot)
                continue
            current[replica.slot] = scrape
            stats.append(gateway_scrape.deployment_stats(self._gateways.get(replica.slot), scrape))
        self._gateways = current
        return gateway_scrape.summed(stats)

    def _stats(self, record_id: int, pid: int, role: str, text: str) -> dict[str, Any]:
        try:
            current = parse(text, time.monotonic())
        except ValueError:
            log.warning("process %d served unparsable metrics", record_id)
            return {}
        previous = self._previous.get(record_id)
        # A new pid is a restarted process: its counters started again from zero.
        before = previous.scrape if previous is not None and previous.pid == pid else None
        self._previous[record_id] = _Previous(pid, current)
        return process_stats(role, before, current)

    def _remote_resources(self, nodes: set[str]) -> dict[str, dict[str, Any]]:
        """Process row id -> CPU and memory, from the heartbeats of the agents of ``nodes``."""
        if not nodes or not settings.REDIS_URL:
            return {}
        try:
            if self._redis is None:
                self._redis = agent_liveness.redis_client()
            beats = agent_liveness.read_all(self._redis, sorted(nodes))
        except redis.RedisError as exc:
            log.warning("no heartbeats to read other nodes' CPU and memory from: %s", exc)
            return {}
        return {key: value for beat in beats.values() for key, value in beat.resources.items()}

    def _annotate_handoffs(self, deployment_id: int, processes: dict[str, dict[str, Any]],
                           slots_by_port: dict[int, str], now: datetime) -> None:
        """Name the router's hand-off pairs by slot and remember each pair's last failure.

        The router's counter carries no error text; the failed backend calls it counted in the
        same second are the best account of what went wrong.
        """
        router = processes.get("router", {})
        errors = ", ".join(router.get("backend_errors_ps") or {}) or "hand-off failed"
        for row in router.get("handoffs", []):
            key = (deployment_id, row["prefill"], row["decode"])
            if row["failed_now"]:
                self._last_failure[key] = {"at": now.isoformat(), "error": errors}
            row["last_failure"] = self._last_failure.get(key)
            row["prefill_slot"] = slots_by_port.get(_port(row["prefill"]))
            row["decode_slot"] = slots_by_port.get(_port(row["decode"]))

    def _store(self, now: datetime, texts: dict[int, str],
               by_deployment: dict[int, dict[str, dict[str, Any]]]) -> list[MetricSample]:
        # One transaction: one commit (one fsync on SQLite) per second, not one per row.
        with transaction.atomic():
            # The raw texts (~50 KB a worker) only feed the console's /metrics, which Prometheus
            # scrapes every 15 s or so: rewriting them every 5 s saves most of the writes.
            if self._raw_stored is None or (
                    (now - self._raw_stored).total_seconds() >= self.raw_every_s):
                self._raw_stored = now
                for record_id, text in texts.items():
                    if not ProcessScrape.objects.filter(process_id=record_id).update(
                            scraped=now, text=text):
                        ProcessScrape.objects.create(process_id=record_id, scraped=now, text=text)
            return MetricSample.objects.bulk_create([
                MetricSample(deployment_id=deployment_id, resolution=MetricSample.Resolution.SECOND,
                             created=now, data={"processes": processes})
                for deployment_id, processes in by_deployment.items()
            ])


def _port(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None
