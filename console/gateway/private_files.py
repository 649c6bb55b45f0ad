"""Files a router or the gateway reads at start and that hold key hashes: 0600 in a 0700
directory, replaced in one rename so that a starting process never reads half a file, and
rewritten only when their text changed (the supervisor asks for them on every tick or round)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: Path, text: str) -> Path:
    if path.is_file() and path.read_text() == text:
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
