"""Quantization jobs in the console: bad input answered before anything runs, a builder that
refuses the model leaves no variant, cancelling, and jobs orphaned by a killed worker.

The builder here is the real CLI in .venv-quant; every case below stops at its input checks,
which come before torch is imported, so each run takes well under a second. Building for real,
through a real Celery worker and in a browser, is in tests/quant.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.catalog.models import BaseModel, QuantizationJob, Variant
from console.quantization import jobs
from console.quantization.builder import _Watch, run_job
from console.supervisor.engine import ProcessEngine
from console.supervisor.models import ManagedProcess
from inference.quantization.output import partial_dir
from tests.console.engine_thread import running_engine  # noqa: F401 - a fixture
from tests.console.passwords import OUTSIDER_PASSWORD, OWNER_PASSWORD
from tests.console.sockets import wait_for
from tests.console.tiny_models import register, write_model

State = QuantizationJob.State
URL = "/api/v1/quantization-jobs/"
# hidden 576 = SmolLM2's: 64 divides it, 128 does not.
SMOLLM2_DIMS = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64}


@pytest.fixture(autouse=True)
def model_dir(settings: Any, tmp_path: Path) -> Path:
    settings.PDSERVE_MODEL_DIR = tmp_path / "models"
    settings.PDSERVE_MODEL_DIR.mkdir()
    return settings.PDSERVE_MODEL_DIR


@pytest.fixture
def base(db: None, tmp_path: Path) -> BaseModel:
    base = BaseModel.objects.create(name="tiny")
    register(base, tmp_path, "bf16", config=SMOLLM2_DIMS)
    return base


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.login(username=owner.username, password=OWNER_PASSWORD)
    return client


def start(api: APIClient, **body: Any) -> Any:
    return api.post(URL, {"base_model": "tiny", **body}, format="json")


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"base_model": "nope", "scheme": "w8a8-int8"}, "base_model", "nope"),
    ({"scheme": "int3"}, "scheme", "int3"),
    ({"scheme": "w4a16", "group_size": 128}, "group_size", "128 does not divide hidden_size 576"),
    ({"scheme": "w4a16", "group_size": 7}, "group_size", "even"),
    ({"scheme": "w8a8-int8", "group_size": 64}, "group_size", "only applies to --scheme w4a16"),
    ({"scheme": "w8a8-int8", "method": "rtn", "smoothing_strength": 0.5}, "smoothing_strength",
     "needs calibration"),
    ({"scheme": "w8a8-int8", "smoothing_strength": 1.5}, "smoothing_strength", "[0, 1)"),
    ({"scheme": "fp8"}, "scheme", "not served on this device (CPU"),
    ({"scheme": "w8a8-int8", "source": "missing"}, "source", "no variant named missing"),
    ({"scheme": "w8a8-int8", "samples": 0}, "samples", "between 1 and 1024"),
    ({"scheme": "w8a8-int8", "name": "not a slug"}, "name", "slug"),
])
def test_bad_input_is_a_400_naming_the_field(api: APIClient, base: BaseModel, body: dict[str, Any],
                                             field: str, words: str) -> None:
    response = start(api, **body)
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert words in " ".join(response.json()[field])
    assert not QuantizationJob.objects.exists()


def test_an_architecture_the_builder_does_not_support_is_named(api: APIClient, base: BaseModel,
                                                               tmp_path: Path) -> None:
    register(base, tmp_path, "moe", config={"architectures": ["MixtralForCausalLM"]})
    response = start(api, scheme="w8a8-int8", source="moe")
    assert response.status_code == 400
    assert "architecture MixtralForCausalLM is not supported" in response.json()["source"][0]


def test_a_quantized_source_is_refused(api: APIClient, base: BaseModel, tmp_path: Path) -> None:
    register(base, tmp_path, "w8", config={"quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {}}})
    response = start(api, scheme="w4a16", source="w8")
    assert response.status_code == 400
    assert "already quantized" in response.json()["source"][0]


def test_an_existing_variant_name_or_a_running_build_of_it_is_a_409(
        api: APIClient, base: BaseModel, tmp_path: Path, django_capture_on_commit_callbacks: Any) -> None:
    register(base, tmp_path, "w8a8-int8-gptq")
    response = start(api, scheme="w8a8-int8")
    assert response.status_code == 409
    assert "already has a variant named w8a8-int8-gptq" in response.json()["name"][0]

    with django_capture_on_commit_callbacks(execute=False):
        assert start(api, scheme="w4a16", method="rtn").status_code == 202
    response = start(api, scheme="w4a16", method="rtn")
    assert response.status_code == 409
    assert "already building tiny/w4a16-rtn" in response.json()["name"][0]


def test_a_directory_already_on_disk_is_a_409(api: APIClient, base: BaseModel, model_dir: Path) -> None:
    (model_dir / "tiny-w4a16-rtn").mkdir()
    response = start(api, scheme="w4a16", method="rtn")
    assert response.status_code == 409
    assert "already exists" in response.json()["name"][0]


def test_an_outsider_can_neither_start_nor_read_jobs(base: BaseModel, outsider: User) -> None:
    client = APIClient()
    assert not client.login(username="outsider", password=OUTSIDER_PASSWORD)
    response = client.post(URL, {"base_model": "tiny", "scheme": "w4a16"}, format="json")
    assert response.status_code in (401, 403)
    assert client.get(URL).status_code in (401, 403)


# ---- the job ------------------------------------------------------------------------------------


def test_a_job_is_queued_with_its_defaults_and_sent_after_commit(
        api: APIClient, base: BaseModel, model_dir: Path, django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = start(api, scheme="w4a16")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["state"], body["method"], body["group_size"], body["name"], body["source"]) == (
        "queued", "gptq", 64, "w4a16-gptq", "bf16")
    assert body["path"] == str(model_dir / "tiny-w4a16-gptq")
    assert len(callbacks) == 1
    assert api.get(f"{URL}{body['id']}/").json()["state"] == "queued"


@pytest.mark.usefixtures("running_engine")
def test_a_builder_that_refuses_the_architecture_fails_the_job_and_leaves_nothing(
        base: BaseModel, tmp_path: Path, model_dir: Path) -> None:
    # The console's own check is bypassed (the row is made directly): the builder must refuse too.
    source = register(base, tmp_path, "moe", config={"architectures": ["MixtralForCausalLM"]})
    job = QuantizationJob.objects.create(base=base, source=source, name="moe-w8", scheme="w8a8-int8",
                                         method="rtn", path=str(model_dir / "tiny-moe-w8"))
    run_job(job.pk)
    job.refresh_from_db()
    assert job.state == State.FAILED
    assert "architecture MixtralForCausalLM is not supported for quantization" in job.error
    assert job.finished_at is not None
    assert not Variant.objects.filter(name="moe-w8").exists()
    assert list(model_dir.iterdir()) == []
    # The supervisor ran it, as a builder row of its process table, and saw it exit.
    builder = ManagedProcess.objects.get(slot=f"build-{job.pk}")
    assert (builder.kind, builder.state, builder.pid) == ("builder", "failed", None)
    assert builder.exit_code not in (None, 0)


def test_a_missing_quantization_environment_fails_the_job_clearly(
        base: BaseModel, settings: Any, model_dir: Path) -> None:
    settings.PDSERVE_QUANT_PYTHON = "/nonexistent/.venv-quant/bin/python"
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    run_job(job.pk)
    job.refresh_from_db()
    assert job.state == State.FAILED
    assert "cannot start the builder /nonexistent/.venv-quant/bin/python" in job.error


def test_cancelling_a_queued_job_means_it_never_runs(base: BaseModel, api: APIClient) -> None:
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    response = api.post(f"{URL}{job.pk}/cancel")
    assert response.status_code == 202
    assert response.json()["state"] == "cancelled"
    run_job(job.pk)
    job.refresh_from_db()
    assert job.state == State.CANCELLED and job.started_at is None
    assert api.post(f"{URL}{job.pk}/cancel").status_code == 409


def test_cancelling_a_running_job_asks_its_worker(base: BaseModel) -> None:
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    QuantizationJob.objects.filter(pk=job.pk).update(state=State.RUNNING, heartbeat_at=timezone.now())
    assert jobs.cancel_job(job).cancel_requested


def test_a_job_whose_worker_stopped_beating_is_failed_and_its_files_removed(
        base: BaseModel, model_dir: Path, api: APIClient, tmp_path: Path) -> None:
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    partial = partial_dir(Path(job.path))
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    # Real processes standing in for the Celery worker that was killed and for the builder it
    # had asked the supervisor for, still running.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = ProcessEngine(log_dir=tmp_path / "logs")
    row = ManagedProcess.objects.create(
        kind="builder", slot=f"build-{job.pk}", role="builder", port=None,
        command=[sys.executable, "-c", "import time; time.sleep(60)", job.path],
        log_path=str(tmp_path / "build.log"), owner_pid=worker.pid,
        owner_started_at=datetime.fromtimestamp(psutil.Process(worker.pid).create_time(), tz=UTC))
    engine.step()
    row.refresh_from_db()
    builder = psutil.Process(row.pid)
    QuantizationJob.objects.filter(pk=job.pk).update(
        state=State.RUNNING, pid=row.pid, heartbeat_at=timezone.now() - timezone.timedelta(seconds=60))
    worker.kill()
    worker.wait()

    # What the supervise daemon runs every few seconds (a GET only reads): while the builder
    # runs, nothing is removed under it; once the engine stopped it, the job fails.
    assert jobs.reap_orphans() == 0
    assert partial.exists() and api.get(f"{URL}{job.pk}/").json()["state"] == "running"
    try:
        wait_for(lambda: engine.step() is not None and not builder.is_running(), "the builder's stop")
        wait_for(lambda: engine.step() is not None and engine.children == {}, "the builder reaped")
    finally:
        engine.stop_children(grace_s=1.0)
    assert jobs.reap_orphans() == 1
    body = api.get(f"{URL}{job.pk}/").json()
    assert body["state"] == "failed"
    assert "worker stopped while building" in body["error"]
    assert not builder.is_running()
    assert not partial.exists()


def test_a_fresh_heartbeat_is_left_alone_and_an_unrelated_pid_is_not_killed(base: BaseModel) -> None:
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
    try:
        QuantizationJob.objects.filter(pk=job.pk).update(state=State.RUNNING, pid=bystander.pid,
                                                         heartbeat_at=timezone.now())
        assert jobs.reap_orphans() == 0
        QuantizationJob.objects.filter(pk=job.pk).update(
            heartbeat_at=timezone.now() - timezone.timedelta(seconds=60))
        assert jobs.reap_orphans() == 1
        time.sleep(0.2)
        assert psutil.Process(bystander.pid).is_running()
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("path", ["/models/", "/models/jobs/", "/models/variants/", URL, "{job}"])
def test_reading_the_jobs_changes_nothing(base: BaseModel, owner: User, path: str) -> None:
    # A job whose worker stopped beating stays running until the supervise daemon reaps it:
    # no GET, of a page or of the API, does the daemon's work.
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    partial = partial_dir(Path(job.path))
    partial.mkdir()
    QuantizationJob.objects.filter(pk=job.pk).update(
        state=State.RUNNING, heartbeat_at=timezone.now() - timezone.timedelta(seconds=60))
    before = list(QuantizationJob.objects.values())
    client = Client()
    client.force_login(owner)
    response = client.get(path.format(job=f"{URL}{job.pk}/"))
    assert response.status_code == 200
    assert list(QuantizationJob.objects.values()) == before
    assert partial.exists()


# ---- pages -----------------------------------------------------------------------------------


@pytest.fixture
def browser_client(owner: User) -> Client:
    client = Client()
    client.login(username=owner.username, password=OWNER_PASSWORD)
    return client


def test_the_catalog_page_has_a_quantize_form_per_model_and_the_job_table(
        browser_client: Client, base: BaseModel) -> None:
    jobs.start_job(base, scheme="w4a16", method="rtn")
    page = browser_client.get("/models/").content.decode()
    assert f'action="/models/{base.pk}/quantize/"' in page
    assert 'data-refresh-url="/models/jobs/"' in page
    table = browser_client.get("/models/jobs/").content.decode()
    assert "tiny/w4a16-rtn" in table and "<progress" in table and "Cancel" in table


def test_the_quantize_form_shows_a_bad_group_size_next_to_the_field(
        browser_client: Client, base: BaseModel) -> None:
    prefix = f"quantize-{base.pk}"
    response = browser_client.post(f"/models/{base.pk}/quantize/",
                                   {f"{prefix}-scheme": "w4a16", f"{prefix}-group_size": "128"})
    assert response.status_code == 400
    assert "128 does not divide hidden_size 576" in response.content.decode()
    assert not QuantizationJob.objects.exists()


def test_the_quantize_form_starts_a_job(browser_client: Client, base: BaseModel,
                                        django_capture_on_commit_callbacks: Any) -> None:
    prefix = f"quantize-{base.pk}"
    with django_capture_on_commit_callbacks(execute=False):
        response = browser_client.post(f"/models/{base.pk}/quantize/",
                                       {f"{prefix}-scheme": "w8a8-int8", f"{prefix}-method": "rtn"})
    assert response.status_code == 302
    job = QuantizationJob.objects.get()
    assert (job.name, job.scheme, job.method, job.smoothing_strength) == ("w8a8-int8-rtn", "w8a8-int8",
                                                                           "rtn", None)
    browser_client.post(f"/models/jobs/{job.pk}/cancel/")
    job.refresh_from_db()
    assert job.state == State.CANCELLED


def test_write_model_used_here_is_quantizable(tmp_path: Path) -> None:
    # Guards the fixtures: a refusal for another reason would make the 400 tests above vacuous.
    from inference.quantization.options import check_architecture, read_config

    assert check_architecture(read_config(write_model(tmp_path / "m", config=SMOLLM2_DIMS))) == (
        "LlamaForCausalLM")


def test_an_event_after_a_progress_bar_frame_on_the_same_line_is_read(base: BaseModel) -> None:
    # Stdout (events) and stderr (log, tqdm bars) share the supervisor's pipe: a bar frame
    # without its newline can come first on an event's line.
    job = jobs.start_job(base, scheme="w4a16", method="rtn")
    watch = _Watch(job, ManagedProcess(slot=f"build-{job.pk}", kind="builder"))
    watch._take('calibrating:  10%|#  | 1/10\rcalibrating:  40%|####  | 4/10'
                '{"event": "progress", "stage": "calibrate", "percent": 41.5, "detail": "layer 4"}')
    watch._take('{"event": "done", "path": "/x", "seconds": 1.5}')
    watch._take('a log line with {"event" in it that is not ours')
    assert watch.progress["percent"] == 41.5 and watch.outcome["event"] == "done"
    assert list(watch.log) == ["calibrating:  40%|####  | 4/10",
                               'a log line with {"event" in it that is not ours']
