"""The API is deliberate: the schema generated from the code is the one committed in
docs/openapi.yaml, generated without a warning; and answers that the views write themselves have
the shape the schema gives them."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client

from console.deployments.models import Deployment
from console.supervisor.models import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "openapi.yaml"
REGENERATE = ".venv/bin/python manage.py spectacular --file docs/openapi.yaml"  # without DATABASE_URL


def test_the_committed_schema_is_the_generated_one(tmp_path: Path) -> None:
    generated = tmp_path / "openapi.yaml"
    # The schema of the default console, on its embedded database: Django bounds integer fields
    # by the database's column ranges, so on PostgreSQL (DATABASE_URL) some maxima differ.
    # --fail-on-warn: a view or field the generator cannot describe fails here, not in review.
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}
    result = subprocess.run([sys.executable, "manage.py", "spectacular", "--file", str(generated),
                             "--validate", "--fail-on-warn"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ours, theirs = COMMITTED.read_text().splitlines(), generated.read_text().splitlines()
    diff = list(difflib.unified_diff(ours, theirs, "docs/openapi.yaml (committed)",
                                     "generated from the code", lineterm="", n=2))
    assert not diff, (
        "The API changed and docs/openapi.yaml does not say so. If the change is deliberate, "
        f"regenerate the schema with `{REGENERATE}` (DATABASE_URL unset: the embedded database) "
        "and commit it with the change.\n"
        + "\n".join(diff[:80]) + ("\n..." if len(diff) > 80 else ""))


def _properties(schema: dict[str, Any], name: str) -> set[str]:
    return set(schema["components"]["schemas"][name]["properties"])


@pytest.fixture
def schema() -> dict[str, Any]:
    return yaml.safe_load(COMMITTED.read_text())


@pytest.mark.django_db
def test_answers_written_by_hand_have_the_schemas_shape(schema: dict[str, Any], owner: User,
                                                         deployment: Deployment) -> None:
    process = ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                            port=1, log_path="/nonexistent.log")
    client = Client()
    client.force_login(owner)
    logs = client.get(f"/api/v1/processes/{process.pk}/logs").json()
    assert set(logs) == _properties(schema, "LogPage")
    metrics = client.get(f"/api/v1/deployments/{deployment.pk}/metrics").json()
    assert set(metrics) == _properties(schema, "MetricHistory")
    gate = client.get(f"/api/v1/deployments/{deployment.pk}/gate").json()
    assert set(gate) == _properties(schema, "DeploymentGate")
    read = client.get(f"/api/v1/deployments/{deployment.pk}/").json()
    assert set(read["gate"]) == _properties(schema, "GateStatus")
