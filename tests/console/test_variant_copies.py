"""A variant's files on another node, as its agent verifies them, and the model.path check's
answer for that node: verifying, verified, missing, different.

The verification runs here in the test's process (``verify``), as the agent runs it on its node;
the request goes to the node's queue on the file-system broker, read back from there."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from console.catalog.copies import request_verification, verify
from console.catalog.models import Variant, VariantCopy
from console.catalog.services import reinspect
from console.celery import app
from console.deployments.models import Deployment
from console.fleet.agent_calls import queue_name
from console.fleet.models import Node, NodeAgent
from console.fleet.services import local_node
from tests.console.tiny_models import make_plan, run


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    return make_plan(tmp_path)


@pytest.fixture
def edge(db: None) -> Node:
    # A queue of its own: the file-system broker keeps what earlier runs left in theirs.
    node = Node.objects.create(name=f"edge-{uuid.uuid4().hex[:8]}", address="10.0.0.7",
                               cpu_ids=[0, 1],
                               memory_bytes=64 << 30, engine_version=local_node().engine_version,
                               kv_connectors=["PdserveSharedStorageConnector", "NixlConnector"])
    NodeAgent.objects.create(node=node, state="up", state_since=timezone.now())
    return node


def queued_copy_ids(node: Node) -> list[int]:
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name(node.name))
        ids = []
        while queue.qsize():
            message = queue.get(timeout=2)
            assert message.headers["task"] == "agent.verify_copy"
            ids.append(message.payload[0][0])
            message.ack()
        queue.close()
        return ids


def test_a_node_copy_is_verified_by_its_agent_and_model_path_says_so(
        plan: Deployment, edge: Node, django_capture_on_commit_callbacks: Any) -> None:
    plan.workers.filter(role="decode").update(node=edge)
    # Asked once the check's transaction commits: the agent must find the row.
    with django_capture_on_commit_callbacks(execute=True):
        outcome = run(plan, "model.path")
    assert outcome.status == "warning"
    assert f"node {edge.name}'s agent is verifying" in outcome.results[0].message
    [copy_id] = queued_copy_ids(edge)
    verify(copy_id)  # what the agent does on its node
    copy = VariantCopy.objects.get(pk=copy_id)
    assert copy.state == "verified" and len(copy.sha256) == 64
    outcome = run(plan, "model.path")
    assert outcome.status == "pass", outcome.as_dict()
    assert f"on {edge.name} (verified by its agent, sha256 {copy.sha256[:12]}" in outcome.summary
    assert queued_copy_ids(edge) == []  # answered for this inspection: not asked again
    # The variant's own hash, once computed where it was inspected, must agree.
    variant = Variant.objects.get(pk=copy.variant_id)
    Variant.objects.filter(pk=variant.pk).update(weights_sha256="0" * 64)
    outcome = run(plan, "model.path")
    assert outcome.status == "error"
    assert "holds other weights" in outcome.results[0].message


def test_a_copy_missing_a_file_or_of_another_size_is_an_error(
        plan: Deployment, edge: Node, tmp_path: Path,
        django_capture_on_commit_callbacks: Any) -> None:
    plan.workers.filter(role="decode").update(node=edge)
    variant = plan.workers.get(role="decode").variant
    with django_capture_on_commit_callbacks(execute=True):
        copy = request_verification(variant, edge)
    weights = Path(variant.path) / variant.weight_files[0]["name"]
    moved = tmp_path / "moved"
    shutil.move(weights, moved)
    verify(copy.pk)
    assert VariantCopy.objects.get(pk=copy.pk).state == "missing"
    outcome = run(plan, "model.path")
    assert outcome.status == "error"
    # The local prefill reads the same directory here: both say so.
    assert any(f"decode: {variant.path} on node {edge.name}: missing in {variant.path}: "
               f"{weights.name}" in r.message for r in outcome.results), outcome.as_dict()
    # The file back, other bytes: a new inspection asks the node again.
    shutil.move(moved, weights)
    with weights.open("ab") as handle:
        handle.write(b"\0" * 8)
    reinspect(variant)
    with django_capture_on_commit_callbacks(execute=True):
        run(plan, "model.path")
    # Asked twice: for the first inspection, and for this one.
    assert queued_copy_ids(edge) == [copy.pk, copy.pk]
    Variant.objects.filter(pk=variant.pk).update(weights_sha256="f" * 64)
    verify(copy.pk)
    assert VariantCopy.objects.get(pk=copy.pk).state == "different"


def test_a_node_whose_agent_is_down_is_not_asked(plan: Deployment, edge: Node) -> None:
    NodeAgent.objects.filter(node=edge).update(state="down")
    plan.workers.filter(role="decode").update(node=edge)
    outcome = run(plan, "model.path")
    assert outcome.status == "warning"
    assert "which no agent up there can verify now" in outcome.results[0].message
    assert not VariantCopy.objects.exists()
