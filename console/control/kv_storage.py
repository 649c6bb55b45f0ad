"""The KV root (settings.PDSERVE_KV_DIR, /dev/shm/pdserve where /dev/shm exists) and the
shared-storage directories under it: one per deployment revision, ``<name>@r<number>``
(``<name>`` for a deployment never started since revisions exist; worker_specs.kv_storage_path).

The root holds prompts' KV in plain files, and /dev/shm is writable by every user: it is ours
alone (mode 0700), and one another user made first is refused rather than used. Directories are
removed only once resolved to inside the root: with a deployment, and once a revision is
retired or failed and none of the deployment's live processes nor an active rollout uses it.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from console.rollouts.models import Revision, Rollout
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.supervisor")

ROOT_MODE = 0o700
# A revision's directory: ``<deployment name>@r<number>`` (deployment names have no "@").
REVISION_DIR = re.compile(r"^(?P<name>[^@/]+)@r(?P<number>\d+)$")


class KVRootRefused(ImproperlyConfigured):
    """The KV root exists but is not a directory of ours."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def kv_root() -> Path:
    return Path(settings.PDSERVE_KV_DIR)


def ensure_kv_root(root: Path | None = None) -> Path:
    """The KV root, made with mode 0700 when missing; its mode set to 0700 when it is ours with
    looser bits. Raises :class:`KVRootRefused` when it is a symbolic link, not a directory, or
    owned by another user (who could read the KV of our prompts or plant KV of their own)."""
    root = root if root is not None else kv_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=ROOT_MODE)
    except FileExistsError:
        pass
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise KVRootRefused(f"PDSERVE_KV_DIR {root} is not a directory (a symbolic link or a "
                            f"file, owned by {_user(info.st_uid)}): remove it or set "
                            f"PDSERVE_KV_DIR to another path")
    me = os.geteuid()
    if info.st_uid != me:
        raise KVRootRefused(f"PDSERVE_KV_DIR {root} is owned by {_user(info.st_uid)}, not by "
                            f"{_user(me)} who runs pdserve: another user's directory could "
                            f"expose or feed the workers' KV cache; remove it or set "
                            f"PDSERVE_KV_DIR to another path")
    if stat.S_IMODE(info.st_mode) != ROOT_MODE:
        os.chmod(root, ROOT_MODE)
    return root


def remove_kv_dir(path: Path, root: Path | None = None) -> bool:
    """Remove the directory ``path`` when it resolves to inside the KV root (never the root
    itself, never through a symbolic link). Returns whether it removed anything."""
    base = (root if root is not None else kv_root()).resolve()
    if path.is_symlink() or not path.is_dir():
        return False
    target = path.resolve()
    if target == base or not target.is_relative_to(base):
        log.warning("not removing KV directory %s: it is not inside the KV root %s", target, base)
        return False
    try:
        shutil.rmtree(target)
    except FileNotFoundError:
        return False
    return True


def deployment_kv_dirs(name: str, root: Path | None = None) -> list[Path]:
    """Every KV directory of the deployment called ``name``: its own and its revisions'."""
    base = root if root is not None else kv_root()
    if not base.is_dir():
        return []
    return sorted(entry for entry in base.iterdir()
                  if entry.name == name or ((match := REVISION_DIR.match(entry.name))
                                            and match["name"] == name))


def remove_deployment_kv_dirs(name: str) -> int:
    """After a deployment is deleted: its KV directories, every revision's. Returns how many."""
    return sum(remove_kv_dir(path) for path in deployment_kv_dirs(name))


def _uses(commands: Iterable[list[str]], path: Path) -> bool:
    # The path as a whole word of an argument: ``name@r1`` is not ``name@r12``.
    used = re.compile(re.escape(str(path)) + r"(?![\w@.-])")
    return any(used.search(str(arg)) for command in commands for arg in command)


def unused_revision_dirs(root: Path | None = None) -> list[Path]:
    """The KV directories of retired and failed revisions that nothing uses any more: no process
    of the deployment that is alive has the directory in its command (blue's draining workers,
    a running plan's workers started before its revision changed) and no active rollout names
    the revision (a rollback can bring a retired revision back)."""
    base = root if root is not None else kv_root()
    if not base.is_dir():
        return []
    found: dict[tuple[str, int], Path] = {}
    for entry in base.iterdir():
        match = REVISION_DIR.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found[(match["name"], int(match["number"]))] = entry
    if not found:
        return []
    ended = Revision.objects.filter(
        deployment__name__in={name for name, _ in found},
        state__in=(Revision.State.RETIRED, Revision.State.FAILED),
    ).exclude(
        pk__in=Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).values("to_revision")
    ).exclude(
        pk__in=Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).values("from_revision")
    ).values_list("deployment_id", "deployment__name", "number")
    candidates = [(deployment_id, found[(name, number)]) for deployment_id, name, number in ended
                  if (name, number) in found]
    if not candidates:
        return []
    commands: dict[int, list[list[str]]] = {}
    for deployment_id, command in ManagedProcess.objects.filter(
            deployment_id__in={pk for pk, _ in candidates},
            state__in=ManagedProcess.ALIVE_STATES).values_list("deployment_id", "command"):
        commands.setdefault(deployment_id, []).append(command or [])
    return [path for deployment_id, path in candidates
            if not _uses(commands.get(deployment_id, []), path)]


def remove_unused_revision_dirs() -> int:
    """The supervisor's sweep: remove :func:`unused_revision_dirs`. Returns how many."""
    removed = 0
    for path in unused_revision_dirs():
        try:
            if remove_kv_dir(path):
                removed += 1
                log.info("removed the KV directory %s of a retired revision", path)
        except OSError as exc:  # e.g. a file of another user's in it: tried at the next sweep
            log.warning("could not remove the KV directory %s: %s", path, exc)
    return removed
