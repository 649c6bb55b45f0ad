"""The sha256 of a variant's weight files, with progress written to the variant as it goes."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from django.utils import timezone

from console.catalog.inspection import combined_sha256
from console.catalog.models import Variant
from console.celery import app

CHUNK_BYTES = 4 * 1024 * 1024
PROGRESS_EVERY_S = 0.5

State = Variant.HashState


class FilesChanged(Exception):
    """A weight file differs from what inspection recorded (size or modification time)."""


@app.task(name="catalog.hash_variant_weights", ignore_result=True)
def hash_variant_weights(variant_id: int, job: str) -> None:
    hash_weights(variant_id, job)


def hash_weights(variant_id: int, job: str) -> bool:
    """Hash the weight files of one variant for hashing request ``job``.

    Returns False when the job was superseded (a newer request, or the variant is gone).
    """
    current = Variant.objects.filter(pk=variant_id, hash_job=job)
    variant = current.first()
    if variant is None:
        return False
    total = variant.weight_bytes
    current.update(hash_state=State.RUNNING, hash_bytes_done=0, hash_bytes_total=total,
                   hash_error="")
    root = Path(variant.path)
    hashes: dict[str, str] = {}
    done = 0
    last_report = time.monotonic()
    try:
        for entry in variant.weight_files:
            path = root / entry["name"]
            _same_as_recorded(path, entry)
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                while chunk := handle.read(CHUNK_BYTES):
                    digest.update(chunk)
                    done += len(chunk)
                    # One UPDATE per half second, not per chunk; it also notices a newer job.
                    if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                        last_report = time.monotonic()
                        if not current.update(hash_bytes_done=done):
                            return False
            # Written while this file was read: the digest matches neither version.
            _same_as_recorded(path, entry)
            hashes[entry["name"]] = digest.hexdigest()
    except (OSError, FilesChanged) as exc:
        current.update(hash_state=State.FAILED,
                       hash_error=f"{exc}; re-inspect the variant to hash it again"[:500])
        return True
    current.update(hash_state=State.DONE, weights_sha256=combined_sha256(hashes),
                   file_hashes=hashes, hash_bytes_done=total, hashed_at=timezone.now())
    return True


def _same_as_recorded(path: Path, entry: dict[str, int | str]) -> None:
    stat = path.stat()
    if stat.st_size != entry["size"] or stat.st_mtime_ns != entry["mtime_ns"]:
        raise FilesChanged(f"{path.name} changed since it was inspected "
                           f"({entry['size']} bytes recorded, {stat.st_size} now)")
