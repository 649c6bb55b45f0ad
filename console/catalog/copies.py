"""A variant's files on another node, verified there by the node's agent: each weight file
present with the inspected size, and their combined sha256 equal to the variant's.

The model.path check asks (:func:`request_verification`) when a plan places a worker of the
variant on an agent's node and no answer for the current inspection exists; the agent answers
on its queue, hashing in a thread of its own so that its queue stays free for control messages.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.db import connection, transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from console.catalog.hashing import CHUNK_BYTES, PROGRESS_EVERY_S
from console.catalog.inspection import combined_sha256
from console.catalog.models import Variant, VariantCopy
from console.celery import app
from console.fleet.agent_calls import queue_name
from console.fleet.models import Node

log = logging.getLogger("pdserve.agents")

State = VariantCopy.State
# A request no agent has taken up in this long is sent again (a lost message, a queue purged).
ASK_AGAIN_AFTER_S = 60


def request_verification(variant: Variant, node: Node) -> VariantCopy:
    """The node's copy of ``variant`` as last verified; asked of the node's agent again when
    there is no answer for the variant's current inspection."""
    copy, created = VariantCopy.objects.get_or_create(
        variant=variant, node=node,
        defaults={"requested_at": timezone.now(), "inspected_at": variant.inspected_at})
    unanswered = (copy.state == State.PENDING
                  and timezone.now() - copy.requested_at > timedelta(seconds=ASK_AGAIN_AFTER_S))
    if not created and copy.inspected_at == variant.inspected_at and not unanswered:
        return copy
    VariantCopy.objects.filter(pk=copy.pk).update(
        state=State.PENDING, sha256="", detail="", bytes_done=0, checked_at=None,
        inspected_at=variant.inspected_at, requested_at=timezone.now())
    copy.refresh_from_db()
    # Once the row is there for the agent to read: a check may run inside a transaction.
    transaction.on_commit(lambda: _ask(copy, node))
    return copy


def _ask(copy: VariantCopy, node: Node) -> None:
    try:
        verify_copy.apply_async(args=[copy.pk], queue=queue_name(node.name))
    except OperationalError as exc:
        VariantCopy.objects.filter(pk=copy.pk).update(
            state=State.FAILED, detail=f"could not ask node {node.name}'s agent: {exc}"[:500])


@app.task(name="agent.verify_copy", ignore_result=True)
def verify_copy(copy_id: int) -> None:
    """On the node: verify in a thread, so the agent's one task slot is free at once."""
    threading.Thread(target=_verify_in_thread, args=(copy_id,), name=f"verify-copy-{copy_id}",
                     daemon=True).start()


def _verify_in_thread(copy_id: int) -> None:
    try:
        verify(copy_id)
    except Exception:
        log.exception("verifying variant copy %d failed", copy_id)
        VariantCopy.objects.filter(pk=copy_id).update(
            state=State.FAILED, detail="the agent failed to verify it; see its log")
    finally:
        connection.close()


def verify(copy_id: int) -> None:
    copy = VariantCopy.objects.select_related("variant").filter(pk=copy_id).first()
    if copy is None:
        return
    variant = copy.variant
    rows = VariantCopy.objects.filter(pk=copy_id, inspected_at=copy.inspected_at)
    root = Path(variant.path)
    if not root.is_dir():
        rows.update(state=State.MISSING, detail=f"{root} is missing or not a directory",
                    checked_at=timezone.now())
        return
    missing = [f["name"] for f in variant.weight_files if not (root / f["name"]).is_file()]
    if missing:
        rows.update(state=State.MISSING, detail=f"missing in {root}: {', '.join(missing)}"[:500],
                    checked_at=timezone.now())
        return
    sized = [f["name"] for f in variant.weight_files
             if (root / f["name"]).stat().st_size != int(f["size"])]
    if sized:
        rows.update(state=State.DIFFERENT, detail=f"sizes differ: {', '.join(sized)}"[:500],
                    checked_at=timezone.now())
        return
    rows.update(state=State.HASHING)
    hashes: dict[str, str] = {}
    done, last_report = 0, time.monotonic()
    try:
        for entry in variant.weight_files:
            digest = hashlib.sha256()
            with (root / entry["name"]).open("rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    digest.update(chunk)
                    done += len(chunk)
                    if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                        last_report = time.monotonic()
                        if not rows.update(bytes_done=done):
                            return  # asked again meanwhile: that request answers
            hashes[entry["name"]] = digest.hexdigest()
    except OSError as exc:
        rows.update(state=State.FAILED, detail=f"cannot read {root}: {exc}"[:500],
                    checked_at=timezone.now())
        return
    sha256 = combined_sha256(hashes)
    variant.refresh_from_db(fields=["weights_sha256"])
    expected = variant.weights_sha256
    if expected and expected != sha256:
        rows.update(state=State.DIFFERENT, sha256=sha256, bytes_done=done,
                    detail=f"sha256 {sha256[:12]}… here, {expected[:12]}… where inspected",
                    checked_at=timezone.now())
        return
    rows.update(state=State.VERIFIED, sha256=sha256, bytes_done=done, checked_at=timezone.now(),
                detail="" if expected else "the variant's own sha256 is not computed yet")
