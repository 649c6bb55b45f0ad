"""GPU memory in the verification report's resources section (on CUDA): what the collector
reads per process tree from the GPU driver, the plan's GPUs a worker's reading is held against,
and the verdicts. This machine has no GPU: the driver's reading is the one part stood in for
(``gpu_by_pid``); the process trees are real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from console.fleet.models import Gpu
from console.live.gpu_memory import GpuMemory
from console.live.resources import TreeUsage
from console.verification.footprint import resources
from console.verification.subject import Endpoint, Subject, subject_of
from console.verification.verdicts import FAIL, PASS, WARN
from tests.console.tiny_models import make_plan

GIB = 1 << 30


def subject(*workers: Endpoint) -> Subject:
    return Subject(deployment_id=1, name="d", model="m", mode="pd", kv_channel="nixl",
                   router=Endpoint("router", "router", "127.0.0.1", 8080, None), workers=workers,
                   side_channels=(), api_key="", worker_key="", concurrency=8,
                   max_model_len=2048, ttft_slo_ms=2000, tpot_slo_ms=200)


def gpu_worker(slot: str, gib: int) -> Endpoint:
    return Endpoint(slot, slot.split("-")[0], "127.0.0.1", 8100, None,
                    node_memory_bytes=64 * GIB, node="a", gpu_memory_bytes=gib * GIB)


def sample(**gpu_gib: float) -> dict[str, dict[str, Any]]:
    return {slot: {"rss": 3 * GIB, "gpu_mem": gib * GIB} for slot, gib in gpu_gib.items()}


def checks(section: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    return {c.name: (c.verdict, c.evidence) for c in section.checks}


def test_a_workers_gpu_memory_is_held_against_its_gpus() -> None:
    found = resources(subject(gpu_worker("prefill-0", 24), gpu_worker("decode-0", 48)),
                      idle=sample(**{"prefill-0": 21.6, "decode-0": 43.0}),
                      loaded=[sample(**{"prefill-0": 21.7, "decode-0": 46.5})])
    by_name = checks(found)
    # vLLM's default 90 % reservation is healthy; 97 % of 48 GiB under load is near the edge.
    assert by_name["GPU memory prefill-0"][0] == PASS
    assert by_name["GPU memory prefill-0"][1]["gpu_share"] == pytest.approx(21.7 / 24, abs=1e-3)
    assert by_name["GPU memory decode-0"][0] == WARN
    assert found.numbers["workers"]["decode-0"]["gpu_peak_gib"] == pytest.approx(46.5, abs=1e-3)
    assert found.numbers["workers"]["decode-0"]["gpu_memory_gib"] == 48.0

    full = resources(subject(gpu_worker("decode-0", 24)), idle=sample(**{"decode-0": 22.0}),
                     loaded=[sample(**{"decode-0": 23.9})])
    assert checks(full)["GPU memory decode-0"][0] == FAIL


def test_a_gpu_worker_without_a_reading_warns_and_a_cpu_worker_has_no_gpu_check() -> None:
    cpu = Endpoint("decode-0", "decode", "127.0.0.1", 8200, None, node_memory_bytes=24 * GIB,
                   node="a")
    found = checks(resources(subject(gpu_worker("prefill-0", 24), cpu),
                             idle={"prefill-0": {"rss": GIB}, "decode-0": {"rss": GIB}},
                             loaded=[{"prefill-0": {"rss": GIB}, "decode-0": {"rss": GIB}}]))
    assert found["GPU memory prefill-0"][0] == WARN
    assert not [name for name in found if name.startswith("GPU memory decode")]


def test_the_plans_gpus_make_a_workers_gpu_memory(db: None, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    decode = plan.workers.get(role="decode")
    for index in (0, 1, 2):
        Gpu.objects.create(node=decode.node, index=index, name="L4", memory_bytes=(20 + index) * GIB)
    plan.workers.filter(pk=decode.pk).update(gpu_indices="1,2")
    by_slot = {w.slot: w.gpu_memory_bytes for w in subject_of(plan).workers}
    assert by_slot == {"prefill-0": 0, "decode-0": 43 * GIB}


def test_a_process_trees_gpu_memory_is_its_descendants_read_once_a_round() -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)']); print(c.pid, flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        reads: list[int] = []

        def driver() -> dict[int, int]:
            reads.append(1)
            return {child: 5 * GIB, 999_999_999: GIB}  # an engine child, and another process

        usage = TreeUsage(driver)
        assert usage.measure(parent.pid)["gpu_mem"] == 5 * GIB
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert "gpu_mem" not in usage.measure(other.pid)  # a tree on no GPU
        finally:
            other.kill()
            other.wait()
        assert len(reads) == 1
        usage.forget_unseen()
        usage.measure(parent.pid)
        assert len(reads) == 2
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_without_a_driver_gpu_memory_is_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def missing() -> None:
        calls.append(1)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    reader = GpuMemory()
    assert reader.by_pid() == {} and reader.by_pid() == {}
    assert calls == [1]
