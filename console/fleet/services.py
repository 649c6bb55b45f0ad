"""Keeping the fleet table true: the local node's record follows what discovery finds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from console.audit.entries import delete_recorded, record, snapshot
from console.fleet.discovery import NodeFacts, local_facts
from console.fleet.models import Gpu, Node, NodeAgent

# Cores, memory and GPUs rarely change; rediscovering on every check would only cost time.
LOCAL_FACTS_MAX_AGE = timedelta(seconds=60)


def record_local_node(facts: NodeFacts) -> Node:
    try:
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(is_local=True).first()
            if node is None:
                node = Node(is_local=True, name=_free_name(facts.name), address="127.0.0.1")
            return _write_facts(node, facts)
    except IntegrityError:
        # Another process (the web process, the supervisor) recorded it between this one's
        # read and insert; there is nothing to lock before the row exists. Theirs stands.
        with transaction.atomic():
            return _write_facts(Node.objects.select_for_update().get(is_local=True), facts)


@transaction.atomic
def record_agent_node(name: str, facts: NodeFacts) -> Node:
    """A node agent's own discovery, into its node's record (added by hand, with its address)."""
    return _write_facts(Node.objects.select_for_update().get(name=name), facts)


def _write_facts(node: Node, facts: NodeFacts) -> Node:
    node.cpu_ids = facts.cpu_ids
    node.memory_bytes = facts.memory_bytes
    node.cpu_flags = facts.cpu_flags
    node.engine_package = facts.engine_package
    node.engine_version = facts.engine_version
    node.kv_connectors = facts.kv_connectors
    node.discovered_at = timezone.now()
    node.save()
    node.gpus.all().delete()
    Gpu.objects.bulk_create(
        Gpu(node=node, index=g.index, name=g.name, uuid=g.uuid, memory_bytes=g.memory_bytes)
        for g in facts.gpus
    )
    return node


def _free_name(hostname: str) -> str:
    # A node added by hand may already carry this machine's host name.
    name = hostname or "local"
    return name if not Node.objects.filter(name=name).exists() else f"{name}-local"


def local_node() -> Node:
    """The local node as last discovered; pages and checks read it, the supervise daemon keeps
    it fresh (:func:`refresh_local_node`). Discovered here only on a database that has no local
    node yet (``bootstrap`` records it first, so pages never do)."""
    node = Node.objects.local()
    return node if node is not None else record_local_node(local_facts())


def refresh_agent_node(node_id: int, max_age: timedelta = LOCAL_FACTS_MAX_AGE) -> Node:
    """A node agent's node, rediscovered where the agent runs when its facts are older than
    ``max_age``: the agent's housekeeping, as :func:`refresh_local_node` is the console's."""
    node = Node.objects.get(pk=node_id)
    if node.discovered_at and timezone.now() - node.discovered_at < max_age:
        return node
    return record_agent_node(node.name, local_facts())


def agent_node_ids() -> set[int]:
    """The nodes that have had an agent: their workers are their agents' to run, never the
    console's, even while an agent is down (its workers may well be serving)."""
    return set(NodeAgent.objects.values_list("node_id", flat=True))


def refresh_local_node(max_age: timedelta = LOCAL_FACTS_MAX_AGE) -> Node:
    """The local node, rediscovered when its facts are older than ``max_age``: the supervise
    daemon's housekeeping, and the Discover button with ``max_age=0``."""
    node = Node.objects.local()
    if node is not None and node.discovered_at and timezone.now() - node.discovered_at < max_age:
        return node
    return record_local_node(local_facts())


def discover_local_node() -> Node:
    """Rediscover the local node now, as someone asked (the Discover button, the API)."""
    node = Node.objects.local()
    before = node_record(node) if node is not None else {}
    node = refresh_local_node(max_age=timedelta(0))
    record("node.discover", node, before=before, after=node_record(node))
    return node


def node_record(node: Node) -> dict[str, Any]:
    """A node as the audit log shows it: its fields and one line per GPU."""
    fields = snapshot(node, exclude=("id", "discovered_at", "updated"))
    fields["gpus"] = [f"{g.index}: {g.name} {g.uuid} {g.memory_bytes}"
                      for g in node.gpus.order_by("index")]
    return fields


def local_node_id() -> int:
    """Default node of a new worker plan: workers run on the local node unless placed elsewhere."""
    node = Node.objects.local()
    return node.pk if node is not None else record_local_node(local_facts()).pk


@transaction.atomic
def save_manual_node(node: Node | None, data: dict[str, object]) -> Node:
    """Create or update a node added by hand; its GPU list is replaced as a whole."""
    before = node_record(node) if node is not None else {}
    node = node or Node()
    gpus = data.pop("gpus", None)
    for name, value in data.items():
        setattr(node, name, value)
    node.full_clean()
    node.save()
    if gpus is not None:
        node.gpus.all().delete()
        for gpu in gpus:  # type: ignore[attr-defined]
            Gpu(node=node, **gpu).full_clean(exclude=["node"])
        Gpu.objects.bulk_create(Gpu(node=node, **gpu) for gpu in gpus)  # type: ignore[attr-defined]
    record("node.edit" if before else "node.create", node, before=before, after=node_record(node))
    return node


@transaction.atomic
def delete_manual_node(node: Node) -> None:
    """ProtectedError while a plan places workers on it."""
    delete_recorded("node.delete", node, node_record(node))
