"""Where a worker keeps its compiled work is decided once per node, not per process: a restart of
a worker and a rollout's green workers of the same model (on other ports, slots, revisions and
KV directories) get the same cache directories and the same compile settings, so they reuse
what an earlier start compiled (inductor's caches are keyed on the traced graph)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.control.worker_specs import green_specs, process_specs
from console.rollouts import revisions, services
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess
from inference.launch import COMPILE_CACHE_ENV
from tests.console.tiny_models import make_plan, make_startable, running

CACHE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", *COMPILE_CACHE_ENV)


@pytest.fixture(autouse=True)
def compiled(settings: Any, tmp_path: Path) -> None:
    # tests/conftest.py starts workers eager; the compile settings are those of compiled ones.
    settings.PDSERVE_ENFORCE_EAGER = False
    settings.PDSERVE_CACHE_DIR = tmp_path / "node-cache"


@pytest.fixture
def rollout(db: None, tmp_path: Path) -> Rollout:
    """A rollout of the same variant that changes --max-num-seqs only (issue 25's green)."""
    deployment = running(make_startable(make_plan(tmp_path)))
    revisions.ensure_live(deployment)
    for worker in deployment.workers.all():
        ManagedProcess.objects.create(deployment=deployment, slot=worker.slot, role=worker.role,
                                      port=worker.port, state=ManagedProcess.State.READY,
                                      log_path="/dev/null")
    draft, _ = revisions.create_draft(
        deployment, {"gate_mode": "off", "extra_engine_args": ["--max-num-seqs", "64"]}, {}, None)
    return services.start(deployment, draft, "canary", None,
                          steps=[{"weight": 10, "hold_s": 0}, {"weight": 100, "hold_s": 0}],
                          scale_down_delay_s=0)


def cache_env(env: dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in CACHE_ENV}


def test_restarts_and_green_workers_share_the_nodes_compile_caches(rollout: Rollout,
                                                                   settings: Any) -> None:
    deployment = rollout.deployment
    blue = [s for s in process_specs(deployment) if s.role != "router"]
    again = [s for s in process_specs(deployment) if s.role != "router"]
    green = green_specs(deployment, rollout)
    assert "--max-num-seqs" in green[0].argv and "--max-num-seqs" not in blue[0].argv
    assert {s.port for s in green}.isdisjoint({s.port for s in blue})

    expected = {
        "VLLM_CACHE_ROOT": str(settings.PDSERVE_CACHE_DIR / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(settings.PDSERVE_CACHE_DIR / "inductor"),
        "XDG_CACHE_HOME": str(settings.PDSERVE_CACHE_DIR),
        # CPU workers: vLLM's AOT cache never loads there (inference/launch.py says why).
        "VLLM_USE_AOT_COMPILE": "0",
    }
    for spec in [*blue, *again, *green]:
        assert cache_env(spec.env) == expected, spec.slot
        for path in (spec.env["VLLM_CACHE_ROOT"], spec.env["TORCHINDUCTOR_CACHE_DIR"]):
            assert str(spec.port) not in path and spec.slot.split("@")[0] not in path


def test_an_eager_worker_leaves_vllms_compile_settings_alone(rollout: Rollout,
                                                             settings: Any) -> None:
    settings.PDSERVE_ENFORCE_EAGER = True
    for spec in process_specs(rollout.deployment):
        assert not set(COMPILE_CACHE_ENV) & set(spec.env), spec.slot
