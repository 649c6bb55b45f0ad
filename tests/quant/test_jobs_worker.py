"""Quantization jobs through a real Celery worker and console: a job that succeeds registers its
variant, a cancelled one and one whose worker was SIGKILLed leave no files and no variant."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil

from inference.quantization.output import partial_dir
from tests.quant.conftest import QuantStack


def start(stack: QuantStack, **body: object) -> dict:
    with stack.api() as client:
        response = client.post("/api/v1/quantization-jobs/", json={"base_model": "tiny", **body})
    assert response.status_code == 202, response.text
    return response.json()


def variants(stack: QuantStack) -> dict[str, dict]:
    with stack.api() as client:
        return {v["name"]: v for v in client.get("/api/v1/variants/?base=tiny").json()["results"]}


def the_builder(stack: QuantStack) -> psutil.Process:
    # The supervisor's child, not the Celery worker's: the task asked the supervisor for it.
    supervisor = psutil.Process(stack.processes["supervisor"].pid)
    builders = [p for p in supervisor.children(recursive=True) if "inference.quantize" in p.cmdline()]
    assert len(builders) == 1, builders
    return builders[0]


def builder_running(job: dict) -> bool:
    return job["state"] == "running" and job["stage"] not in ("", "starting")


def test_a_job_reports_progress_and_registers_the_variant(quant_stack: QuantStack) -> None:
    job = start(quant_stack, scheme="w8a8-int8", name="w8-gptq")
    assert job["state"] == "queued" and job["smoothing_strength"] == 0.8
    done, seen = quant_stack.wait_job(job["id"], lambda j: j["state"] not in ("queued", "running"))
    assert done["state"] == "succeeded", done["error"] + done["log_tail"][-2000:]
    assert done["percent"] == 100 and done["build_seconds"] > 0
    # It was seen in between, not only at the ends.
    assert any(0 < s["percent"] < 100 and s["state"] == "running" for s in seen)
    assert "GPTQ" in done["log_tail"]  # llmcompressor's own log lines came through

    variant = variants(quant_stack)["w8-gptq"]
    assert done["variant"] == {"id": variant["id"], "name": "w8-gptq"}
    assert variant["quantization"] == "compressed-tensors w8a8"
    assert variant["kv_geometry"] == variants(quant_stack)["bf16"]["kv_geometry"]
    assert variant["path"] == done["path"] and Path(done["path"]).is_dir()


def test_cancelling_a_running_job_kills_the_builder_and_removes_its_files(quant_stack: QuantStack) -> None:
    job = start(quant_stack, scheme="w4a16", name="w4-cancelled")
    quant_stack.wait_job(job["id"], builder_running)
    builder = the_builder(quant_stack)
    with quant_stack.api() as client:
        assert client.post(f"/api/v1/quantization-jobs/{job['id']}/cancel").status_code == 202
    cancelled, _ = quant_stack.wait_job(job["id"], lambda j: j["state"] != "running", timeout_s=60)
    assert cancelled["state"] == "cancelled"
    assert not builder.is_running()
    assert not Path(job["path"]).exists() and not partial_dir(Path(job["path"])).exists()
    assert "w4-cancelled" not in variants(quant_stack)
    with quant_stack.api() as client:
        assert client.post(f"/api/v1/quantization-jobs/{job['id']}/cancel").status_code == 409


def test_a_job_whose_worker_is_killed_is_failed_and_cleaned_up(quant_stack: QuantStack) -> None:
    job = start(quant_stack, scheme="w8a8-int8", name="w8-orphan")
    quant_stack.wait_job(job["id"], builder_running)
    builder = the_builder(quant_stack)
    worker = quant_stack.processes["worker"]
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    # The supervisor stops the builder once its requester is gone (and the builder removes its
    # partial directory on the way out).
    psutil.wait_procs([builder], timeout=30)
    assert not builder.is_running()

    quant_stack.start_worker()
    failed, _ = quant_stack.wait_job(job["id"], lambda j: j["state"] != "running", timeout_s=60)
    assert failed["state"] == "failed"
    assert "worker stopped while building" in failed["error"]
    assert not Path(job["path"]).exists() and not partial_dir(Path(job["path"])).exists()
    assert "w8-orphan" not in variants(quant_stack)


def measurement(stack: QuantStack, measurement_id: int) -> dict:
    response = stack.call("GET", f"/api/v1/measurements/{measurement_id}/")
    response.raise_for_status()
    return response.json()


def vllm_servers(stack: QuantStack) -> list[psutil.Process]:
    supervisor = psutil.Process(stack.processes["supervisor"].pid)
    return [p for p in supervisor.children() if "vllm" in " ".join(p.cmdline())]


def test_a_measurement_whose_worker_is_killed_stops_its_server_and_can_run_again(
        quant_stack: QuantStack) -> None:
    bf16 = variants(quant_stack)["bf16"]
    with quant_stack.api() as client:
        response = client.post("/api/v1/measurements/", json={"variant": bf16["id"], "dtype": "float32"})
    assert response.status_code == 202, response.text
    first = response.json()
    # Mid-run: the supervisor has started the measurement's vLLM server for the task.
    deadline = time.monotonic() + 120
    while not vllm_servers(quant_stack):
        assert time.monotonic() < deadline, measurement(quant_stack, first["id"])
        time.sleep(0.5)
    server = vllm_servers(quant_stack)[0]
    assert measurement(quant_stack, first["id"])["state"] == "running"

    worker = quant_stack.processes["worker"]
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    killed = time.monotonic()
    gone, alive = psutil.wait_procs([server], timeout=10)
    assert alive == [], "the measurement's vLLM server outlived its Celery worker by 10 s"
    assert time.monotonic() - killed < 10

    deadline = time.monotonic() + 30  # the supervise daemon's housekeeping runs every 5 s
    while (row := measurement(quant_stack, first["id"]))["state"] == "running":
        assert time.monotonic() < deadline, row
        time.sleep(0.5)
    assert row["state"] == "failed"
    assert f"its Celery worker (pid {worker.pid}) stopped mid-run" in row["error"]
    assert "is gone; stopped" in row["error"]  # the supervisor's own reason, quoted

    quant_stack.start_worker()
    with quant_stack.api() as client:
        response = client.post("/api/v1/measurements/", json={"variant": bf16["id"], "dtype": "float32"})
    assert response.status_code == 202, response.text
    again = response.json()
    deadline = time.monotonic() + 420
    while (row := measurement(quant_stack, again["id"]))["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, row
        time.sleep(1)
    assert row["state"] == "done", row["error"]
    assert row["prefill_tps"] > 0 and row["decode_tps"] > 0
    assert vllm_servers(quant_stack) == []  # released when the measurement was done
