"""Node agents' heartbeats through Redis, and the judge that marks a node's agent up or down.

Each agent (``manage.py agent --node NAME``) writes its heartbeat to one Redis key every
``PDSERVE_AGENT_HEARTBEAT_S``: a sequence number, its pid and host, its process table and its
devices. The judge runs in the alert evaluator's tick (one holder at a time, under its lease)
and measures a heartbeat's age on its own clock, from when it first saw the sequence number
change, so that clocks that differ between hosts do not matter.

Hysteresis, against the peers' users' false mass "not ready":

- a node is marked down only after ``PDSERVE_AGENT_GRACE_S`` without a new heartbeat;
- while the judge itself cannot read Redis it judges nothing, and once it can again, every node
  gets a whole grace to be heard from: a control-plane blip marks no node down;
- a judge that has just taken over (a new evaluator, a new lease holder) starts every node's
  grace afresh for the same reason;
- a node marked down comes back up at its next new heartbeat.

Nothing is rescheduled when a node goes down: its workers may well be serving (an agent that
lost Redis keeps them running), and a plan moves workers only when someone changes it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from console.audit.actors import acting_as
from console.audit.entries import record
from console.fleet.models import Node, NodeAgent

log = logging.getLogger("pdserve.agents")

KEY_PREFIX = "pdserve:agent:"


def heartbeat_key(node_name: str) -> str:
    return f"{KEY_PREFIX}{node_name}"


def redis_client(url: str | None = None) -> redis.Redis:
    """A client that gives up on a dead server within seconds: a heartbeat or a judgement that
    waits longer is late anyway."""
    return redis.Redis.from_url(url or settings.REDIS_URL, socket_timeout=2.0,
                                socket_connect_timeout=2.0)


@dataclass(frozen=True)
class Heartbeat:
    node: str
    seq: int
    pid: int
    hostname: str
    started_at: float
    # The agent's clock when it wrote this: shown, never judged (clocks differ between hosts).
    sent_at: float = 0.0
    processes: dict[str, str] = field(default_factory=dict)  # "deployment/slot" -> state
    devices: dict[str, Any] = field(default_factory=dict)
    # Process row id -> {"cpu": % of one core, "rss": bytes} of each process and its children.
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Heartbeat:
        data = json.loads(raw)
        return cls(node=str(data["node"]), seq=int(data["seq"]), pid=int(data["pid"]),
                   hostname=str(data["hostname"]), started_at=float(data["started_at"]),
                   sent_at=float(data.get("sent_at", 0.0)),
                   processes={str(k): str(v) for k, v in data.get("processes", {}).items()},
                   devices=dict(data.get("devices", {})),
                   resources={str(k): dict(v) for k, v in data.get("resources", {}).items()})


def publish(client: redis.Redis, heartbeat: Heartbeat, grace_s: float) -> None:
    """Write ``heartbeat``; it expires after ten graces, so a node given up stops showing one."""
    client.set(heartbeat_key(heartbeat.node), heartbeat.to_json(), ex=max(1, int(grace_s * 10)))


def read_all(client: redis.Redis, names: list[str]) -> dict[str, Heartbeat]:
    """The current heartbeat of each named node that has one."""
    if not names:
        return {}
    found: dict[str, Heartbeat] = {}
    for name, raw in zip(names, client.mget([heartbeat_key(n) for n in names]), strict=True):
        if raw is None:
            continue
        try:
            found[name] = Heartbeat.from_json(raw)
        except (ValueError, KeyError, TypeError):
            log.warning("node %s: an unreadable heartbeat %r; treated as none", name, raw[:200])
    return found


# ---- the judge ---------------------------------------------------------------------------
@dataclass
class Watch:
    """What the judge remembers of one node: the last sequence number seen, and when (on the
    judge's clock) it was first seen."""

    seq: int | None
    heard_at: float


def judge(age_s: float, grace_s: float) -> str:
    """A node's agent state given how long its heartbeat has not changed."""
    return NodeAgent.State.UP if age_s <= grace_s else NodeAgent.State.DOWN


@dataclass
class Judgement:
    node: str
    state: str
    age_s: float


@dataclass
class NodeMonitor:
    """Marks node agents up and down from their heartbeats; :meth:`step` once per evaluator tick."""

    grace_s: float = field(default_factory=lambda: float(settings.PDSERVE_AGENT_GRACE_S))
    url: str = field(default_factory=lambda: settings.REDIS_URL)
    watches: dict[str, Watch] = field(default_factory=dict)
    # When the judge last could not read Redis: every grace restarts from its recovery.
    blind: bool = False
    _client: redis.Redis | None = None

    def step(self, now: float | None = None) -> list[Judgement]:
        """Read the heartbeats of every node that has had an agent, and store each node's
        state when it changes. Returns the judgements (nothing while Redis is unreadable)."""
        if not self.url:
            return []  # one host: no agents, nothing to judge
        now = time.monotonic() if now is None else now
        agents = list(NodeAgent.objects.select_related("node"))
        beats = self._read([a.node.name for a in agents])
        if beats is None:
            if not self.blind:
                log.warning("cannot read agent heartbeats from Redis; judging no node until "
                            "it answers, then giving every node a whole grace")
            self.blind = True
            return []
        if self.blind:
            self.blind = False
            self.watches = {}  # a whole grace for everyone, from now
        judgements = []
        for agent in agents:
            name = agent.node.name
            beat = beats.get(name)
            watch = self.watches.get(name)
            # A node this judge has not watched yet is watched from now: a whole grace.
            if watch is None:
                watch = self.watches[name] = Watch(beat.seq if beat else None, now)
            elif beat is not None and beat.seq != watch.seq:
                watch.seq, watch.heard_at = beat.seq, now
            age = now - watch.heard_at
            state = judge(age, self.grace_s)
            judgements.append(Judgement(name, state, age))
            self._store(agent, state, beat, fresh=watch.heard_at == now and beat is not None)
        for gone in set(self.watches) - {a.node.name for a in agents}:
            del self.watches[gone]
        return judgements

    def _read(self, names: list[str]) -> dict[str, Heartbeat] | None:
        try:
            if self._client is None:
                self._client = redis_client(self.url)
            return read_all(self._client, names)
        except redis.RedisError as exc:
            log.debug("heartbeat read failed: %s", exc)
            return None

    def _store(self, agent: NodeAgent, state: str, beat: Heartbeat | None, fresh: bool) -> None:
        fields: dict[str, Any] = {}
        if fresh and beat is not None:
            fields.update(seen_at=timezone.now(), heartbeat=beat.__dict__)
        if state != agent.state:
            fields.update(state=state, state_since=timezone.now())
        if not fields:
            return
        NodeAgent.objects.filter(pk=agent.pk).update(**fields)
        if "state" in fields:
            log.warning("node %s: agent %s", agent.node.name, state)
            # The judge runs in the alert evaluator's thread, outside any request or command.
            with acting_as("system", "agent-judge"):
                record(f"node.agent_{state}", agent.node, before={"agent": agent.state},
                       after={"agent": state})


def register(node: Node, heartbeat: Heartbeat, now: datetime | None = None) -> None:
    """An agent announces itself: its node is the agent's to run from now on, and up."""
    now = now or timezone.now()
    before = NodeAgent.objects.filter(node=node).values_list("state", flat=True).first()
    NodeAgent.objects.update_or_create(node=node, defaults={
        "state": NodeAgent.State.UP, "state_since": now, "seen_at": now,
        "heartbeat": heartbeat.__dict__})
    if before != NodeAgent.State.UP:
        record("node.agent_up", node, before={"agent": before or "none"},
               after={"agent": NodeAgent.State.UP})
