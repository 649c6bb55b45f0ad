"""Registering model directories and keeping their recorded facts true."""

from __future__ import annotations

import logging
import uuid
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone
from kombu.exceptions import OperationalError

from console.audit.entries import delete_recorded, record, snapshot
from console.catalog.hashing import hash_variant_weights
from console.catalog.inspection import InspectionError, ModelInspection, inspect_model_dir
from console.catalog.models import BaseModel, Variant

log = logging.getLogger("pdserve.catalog")

State = Variant.HashState
# What the audit log shows of a variant: where it is and what it is, not every fact inspection
# read (those are on the variant, and change with every re-inspection).
VARIANT_FIELDS = ("base", "name", "path", "format", "dtype", "quantization", "architecture",
                  "modalities", "inspection_error")
MODEL_FIELDS = ("name", "description")


class RegistrationError(ValueError):
    """A directory that cannot be registered; ``field`` names the input at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@transaction.atomic
def register_variant(base: BaseModel, name: str, path: str) -> Variant:
    """Inspect ``path`` and record it as variant ``name`` of ``base``; hashing starts after commit."""
    try:
        inspection = inspect_model_dir(path)
    except InspectionError as exc:
        raise RegistrationError("path", str(exc)) from exc
    variant = Variant(base=base, name=name, path=path)
    _apply(variant, inspection)
    variant.save()
    queue_hashing(variant)
    record("variant.create", variant, after=snapshot(variant, VARIANT_FIELDS))
    return variant


@transaction.atomic
def create_base_model(name: str, description: str = "") -> BaseModel:
    model = BaseModel(name=name, description=description)
    model.full_clean()
    model.save()
    record("model.create", model, after=snapshot(model, MODEL_FIELDS))
    return model


@transaction.atomic
def edit_base_model(model: BaseModel, changes: dict[str, Any]) -> BaseModel:
    before = snapshot(model, MODEL_FIELDS)
    for field, value in changes.items():
        setattr(model, field, value)
    model.full_clean()
    model.save()
    record("model.edit", model, before=before, after=snapshot(model, MODEL_FIELDS))
    return model


@transaction.atomic
def delete_base_model(model: BaseModel) -> None:
    """ProtectedError while a variant or a deployment refers to it."""
    delete_recorded("model.delete", model, snapshot(model, MODEL_FIELDS))


@transaction.atomic
def rename_variant(variant: Variant, name: str) -> Variant:
    before = snapshot(variant, VARIANT_FIELDS)
    variant.name = name
    # Only the name changed: a directory gone since does not stop a rename.
    variant.clean_fields(exclude=[f.name for f in Variant._meta.fields if f.name != "name"])
    variant.validate_constraints()
    variant.save(update_fields=["name"])
    record("variant.edit", variant, before=before, after=snapshot(variant, VARIANT_FIELDS))
    return variant


@transaction.atomic
def delete_variant(variant: Variant) -> None:
    """Forget the variant (its directory stays on disk); ProtectedError while a plan uses it."""
    delete_recorded("variant.delete", variant, snapshot(variant, VARIANT_FIELDS))


@transaction.atomic
def reinspect_variant(variant: Variant) -> Variant:
    """``reinspect`` asked for by someone (a button, the API): recorded in the audit log."""
    before = snapshot(variant, VARIANT_FIELDS)
    reinspect(variant)
    record("variant.reinspect", variant, before=before, after=snapshot(variant, VARIANT_FIELDS))
    return variant


def protected_by(exc: ProtectedError) -> str:
    """What a refused delete is still used by, in words."""
    return ", ".join(sorted({f"{o._meta.verbose_name} {o}" for o in exc.protected_objects}))


@transaction.atomic
def reinspect(variant: Variant) -> Variant:
    """Read the directory again; a failure is recorded on the variant, not raised.

    The stored facts are what every check compares, so after a directory changes they must be
    refreshed, and a directory that broke must show as broken.
    """
    try:
        inspection = inspect_model_dir(variant.path)
    except InspectionError as exc:
        variant.inspection_error = str(exc)[:500]
        variant.inspected_at = timezone.now()
        variant.hash_state, variant.hash_job = State.PENDING, ""
        variant.save()
        return variant
    _apply(variant, inspection)
    variant.save()
    queue_hashing(variant)
    return variant


def ensure_variant(base: BaseModel, name: str, path: str) -> Variant:
    """The variant at ``path``, registered leniently: a broken directory is recorded, not refused.

    For the default deployment, whose directory ``make up`` prepares: the checks then explain
    what is wrong instead of bootstrap failing.
    """
    variant, created = Variant.objects.get_or_create(base=base, name=name, defaults={"path": path})
    if created or variant.path != path or is_stale(variant):
        variant.path = path
        reinspect(variant)
    return variant


def is_stale(variant: Variant) -> bool:
    """Whether the directory no longer matches what inspection recorded."""
    if not variant.inspected:
        return True
    return bool(changed_weight_files(variant))


def changed_weight_files(variant: Variant) -> list[str]:
    """Weight files whose size or modification time differ from the record (or are gone)."""
    changed = []
    for entry in variant.weight_files:
        try:
            stat = (Path(variant.path) / entry["name"]).stat()
        except OSError:
            changed.append(f"{entry['name']} (missing)")
            continue
        if stat.st_size != entry["size"] or stat.st_mtime_ns != entry["mtime_ns"]:
            changed.append(f"{entry['name']} ({entry['size']} -> {stat.st_size} bytes)"
                           if stat.st_size != entry["size"] else f"{entry['name']} (rewritten)")
    return changed


def queue_hashing(variant: Variant) -> None:
    """Ask the background worker to hash the weights once this transaction commits."""
    variant.hash_job = str(uuid.uuid4())
    variant.hash_state = State.QUEUED
    variant.hash_bytes_done, variant.hash_bytes_total = 0, variant.weight_bytes
    variant.hash_error, variant.weights_sha256, variant.file_hashes = "", "", {}
    variant.hashed_at = None
    variant.save(update_fields=["hash_job", "hash_state", "hash_bytes_done", "hash_bytes_total",
                                "hash_error", "weights_sha256", "file_hashes", "hashed_at"])
    transaction.on_commit(partial(_send, variant.pk, variant.hash_job))


def _send(variant_id: int, job: str) -> None:
    try:
        hash_variant_weights.delay(variant_id, job)
    except OperationalError as exc:
        log.warning("could not queue hashing of variant %s: %s", variant_id, exc)
        Variant.objects.filter(pk=variant_id, hash_job=job).update(
            hash_state=State.FAILED, hash_error=f"could not queue the hashing job: {exc}"[:500]
        )


def _apply(variant: Variant, inspection: ModelInspection) -> None:
    for name, value in asdict(inspection).items():
        setattr(variant, name, value)
    variant.inspected_at = timezone.now()
    variant.inspection_error = ""
