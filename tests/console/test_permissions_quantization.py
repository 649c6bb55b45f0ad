"""Quantization builds add variants to the catalog every team shares: a superuser's alone to
start and cancel, each writing one audit entry; members read the jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.catalog.models import BaseModel, QuantizationJob
from tests.console.team_users import Crew, actions, api_as, make_crew
from tests.console.tiny_models import register


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def base(db: None, tmp_path: Path, settings: Any) -> BaseModel:
    settings.PDSERVE_MODEL_DIR = tmp_path / "models"
    base = BaseModel.objects.create(name="tiny")
    register(base, tmp_path, "bf16")
    return base


def test_members_read_jobs_but_neither_start_nor_cancel(crew: Crew, owner: User,
                                                        base: BaseModel) -> None:
    job = api_as(owner).post("/api/v1/quantization-jobs/", {"base_model": "tiny",
                                                            "scheme": "w8a8-int8",
                                                            "method": "rtn"}, format="json")
    assert job.status_code == 202, job.content
    before = actions()
    for user in (crew.viewer, crew.admin, crew.stranger):
        api = api_as(user)
        assert api.get(f"/api/v1/quantization-jobs/{job.json()['id']}/").status_code == 200
        assert api.post("/api/v1/quantization-jobs/", {"base_model": "tiny",
                                                       "scheme": "w4a16"},
                        format="json").status_code == 403
        assert api.post(f"/api/v1/quantization-jobs/{job.json()['id']}/cancel/"
                        ).status_code == 403
    page = Client()
    page.force_login(crew.admin)
    assert page.post(f"/models/{base.pk}/quantize/", {f"quantize-{base.pk}-scheme": "w4a16"}
                     ).status_code == 403
    assert page.post(f"/models/jobs/{job.json()['id']}/cancel/").status_code == 403
    html = page.get("/models/").content.decode()
    assert "quantize-form" not in html and "job-cancel" not in html
    assert actions() == before
    assert QuantizationJob.objects.get().state == QuantizationJob.State.QUEUED


def test_start_and_cancel_write_one_entry_each(owner: User, base: BaseModel) -> None:
    api = api_as(owner)
    job = api.post("/api/v1/quantization-jobs/", {"base_model": "tiny", "scheme": "w8a8-int8",
                                                  "method": "rtn"}, format="json").json()
    assert api.post(f"/api/v1/quantization-jobs/{job['id']}/cancel/").status_code == 202
    # Cancelling twice is a 409 and no second entry.
    assert api.post(f"/api/v1/quantization-jobs/{job['id']}/cancel/").status_code == 409
    assert actions("job.") == [("job.start", "owner"), ("job.cancel", "owner")]
