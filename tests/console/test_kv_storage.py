"""The KV root and the shared-storage directories under it: the root is made 0700 (and set to
0700 when it is ours with looser bits), refused when it is another user's or not a directory;
a deleted deployment's directories go, every revision's; a retired revision's goes at the
supervisor's sweep once no live process nor active rollout uses it; nothing outside the root
is ever removed."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from console.control import lifecycle
from console.control.daemon import Supervisor
from console.control.kv_storage import (
    KVRootRefused,
    ensure_kv_root,
    remove_deployment_kv_dirs,
    remove_kv_dir,
    remove_unused_revision_dirs,
)
from console.deployments.models import Deployment
from console.rollouts.models import Revision, Rollout
from console.supervisor.models import ManagedProcess

OTHER_UID = 54321  # no user of this machine: the tests run as root, which may chown


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def root(settings: Any, tmp_path: Path) -> Path:
    settings.PDSERVE_KV_DIR = tmp_path / "shm" / "pdserve"
    return settings.PDSERVE_KV_DIR


@pytest.fixture
def theirs(root: Path) -> Path:
    """The root made first by another user, as anyone may in /dev/shm."""
    root.mkdir(parents=True, mode=0o755)
    os.chown(root, OTHER_UID, OTHER_UID)
    return root


def test_the_root_is_made_0700(root: Path) -> None:
    old = os.umask(0)  # whatever the umask, not more than 0700
    try:
        assert ensure_kv_root() == root
    finally:
        os.umask(old)
    assert root.is_dir() and mode(root) == 0o700
    assert root.stat().st_uid == os.geteuid()


def test_our_root_with_looser_bits_is_set_to_0700(root: Path) -> None:
    root.mkdir(parents=True)
    root.chmod(0o777)
    (root / "dep@r1").mkdir()
    ensure_kv_root()
    assert mode(root) == 0o700 and (root / "dep@r1").is_dir()


def test_another_users_root_is_refused(theirs: Path) -> None:
    with pytest.raises(KVRootRefused) as refused:
        ensure_kv_root()
    assert str(theirs) in str(refused.value) and f"uid {OTHER_UID}" in str(refused.value)
    # Left as it was: not taken over, not loosened or tightened.
    assert theirs.stat().st_uid == OTHER_UID and mode(theirs) == 0o755


def test_a_symlink_or_a_file_as_the_root_is_refused(root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root.parent.mkdir(parents=True)
    root.symlink_to(elsewhere)
    with pytest.raises(KVRootRefused, match="is not a directory"):
        ensure_kv_root()
    root.unlink()
    root.write_text("x")
    with pytest.raises(KVRootRefused, match="is not a directory"):
        ensure_kv_root()


@pytest.fixture
def keep_signals() -> Iterator[None]:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.django_db
@pytest.mark.usefixtures("keep_signals")
def test_the_supervisor_does_not_start_on_another_users_root(theirs: Path, settings: Any,
                                                             tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path / "data"
    with pytest.raises(CommandError, match=f"{theirs} is owned by uid {OTHER_UID}"):
        call_command("supervise")


def dirs(root: Path, *names: str) -> list[Path]:
    made = []
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "kv.safetensors").write_text("x")
        made.append(root / name)
    return made


def present(root: Path) -> set[str]:
    return {entry.name for entry in root.iterdir()}


def test_a_deleted_deployments_directories_go_every_revisions(
        root: Path, deployment: Deployment,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    name = deployment.name
    dirs(root, name, f"{name}@r1", f"{name}@r2", f"{name}-b@r1", f"{name}x", "other@r1")
    lifecycle.stop(deployment)
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.delete(deployment)
    assert present(root) == {f"{name}-b@r1", f"{name}x", "other@r1"}


def test_nothing_outside_the_root_is_removed(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    dirs(outside.parent, outside.name)
    root.mkdir(parents=True)
    (root / "dep@r1").symlink_to(outside)
    assert remove_deployment_kv_dirs("dep") == 0
    assert not remove_kv_dir(outside)
    assert not remove_kv_dir(root)
    assert not remove_kv_dir(root / ".." / "precious")
    assert (outside / "kv.safetensors").exists() and root.is_dir()


def _revision(deployment: Deployment, number: int, state: str) -> Revision:
    return Revision.objects.create(deployment=deployment, number=number, spec={}, state=state)


def _alive(deployment: Deployment, slot: str, kv_dir: Path) -> ManagedProcess:
    return ManagedProcess.objects.create(
        deployment=deployment, slot=slot, role="decode", port=8200,
        state=ManagedProcess.State.READY, log_path="/nonexistent.log",
        command=["python", "-m", "inference.launch", "--kv-storage-path", str(kv_dir)])


@pytest.mark.django_db
def test_a_retired_revisions_directory_goes_once_nothing_uses_it(
        root: Path, deployment: Deployment) -> None:
    name = deployment.name
    dirs(root, *(f"{name}@r{n}" for n in (1, 2, 3, 4, 12)), "gone@r1")
    r1 = _revision(deployment, 1, Revision.State.RETIRED)
    r2 = _revision(deployment, 2, Revision.State.FAILED)
    _revision(deployment, 3, Revision.State.LIVE)
    _revision(deployment, 4, Revision.State.RETIRED)
    _revision(deployment, 12, Revision.State.RETIRED)
    # Blue r1's worker still drains after the rollout that retired it; so does r12's.
    draining = _alive(deployment, "decode-0@r1", root / f"{name}@r1")
    _alive(deployment, "decode-1@r12", root / f"{name}@r12")
    _alive(deployment, "decode-0", root / f"{name}@r3")
    # A rollout back to r2 is under way.
    rollout = Rollout.objects.create(deployment=deployment, from_revision=r1, to_revision=r2,
                                     strategy=Rollout.Strategy.BLUE_GREEN, steps=[], analysis={},
                                     state=Rollout.State.STARTING, state_since=timezone.now())
    # r4: retired, and nothing uses it.
    assert remove_unused_revision_dirs() == 1
    assert f"{name}@r4" not in present(root)
    Rollout.objects.filter(pk=rollout.pk).update(state=Rollout.State.ROLLED_BACK)
    assert remove_unused_revision_dirs() == 1
    assert f"{name}@r2" not in present(root)
    ManagedProcess.objects.filter(pk=draining.pk).update(state=ManagedProcess.State.STOPPED)
    # The supervisor's sweep removes r1's once blue's worker stopped (r12's worker's path is
    # not r1's); the live r3's stays, and so does r12's, and a directory of no deployment this
    # console knows is not its to remove.
    supervisor = Supervisor(log_dir=root.parent / "logs")
    assert supervisor.sweep()
    assert present(root) == {f"{name}@r3", f"{name}@r12", "gone@r1"}
