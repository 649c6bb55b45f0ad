"""Gates and measurements by role: a deployment's gate results are its team's to read and its
operators' to run (404 to anyone else); a variant is measured by a superuser or an operator of
a team with a deployment of its model (console/quality/measure_permission.py); each run or start writes one
audit entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.accounts.models import Membership, Role
from console.catalog.models import BaseModel, Variant
from console.deployments.models import Deployment
from console.fleet.services import local_node
from console.quality.models import GateResult, VariantMeasurement
from tests.console.team_users import Crew, actions, api_as, make_crew
from tests.console.tiny_models import make_plan, register


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def running(crew: Crew, tmp_path: Path) -> Deployment:
    plan = make_plan(tmp_path)
    assert plan.team_id == crew.team.pk
    Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.RUNNING)
    plan.refresh_from_db()
    return plan


def test_gates_by_role(crew: Crew, running: Deployment) -> None:
    gate_api = f"/api/v1/deployments/{running.pk}/gate"
    assert api_as(crew.viewer).get(gate_api).status_code == 200
    assert api_as(crew.viewer).post(gate_api).status_code == 403
    assert api_as(crew.stranger).get(gate_api).status_code == 404
    assert api_as(crew.stranger).post(gate_api).status_code == 404
    page = Client()
    page.force_login(crew.viewer)
    assert page.post(f"/deployments/{running.name}/gate/run/").status_code == 403
    assert not GateResult.objects.exists()
    ran = api_as(crew.operator).post(gate_api)
    assert ran.status_code == 202, ran.content
    assert actions("gate.") == [("gate.run", "otto")]
    result = f"/api/v1/gate-results/{ran.json()['id']}/"
    assert api_as(crew.viewer).get(result).status_code == 200
    assert api_as(crew.stranger).get(result).status_code == 404
    assert api_as(crew.stranger).get("/api/v1/gate-results/").json()["results"] == []
    page.force_login(crew.stranger)
    assert page.get(f"/deployments/{running.name}/gate/").status_code == 404
    assert page.get(f"/deployments/{running.name}/advice/").status_code == 404


def test_measurements_by_role(crew: Crew, owner: User, running: Deployment,
                              tmp_path: Path) -> None:
    variant = Variant.objects.get(base=running.base_model, name="bf16")
    other = register(BaseModel.objects.create(name="other"), tmp_path / "other", "bf16")
    node = local_node().name

    def measure(user: User, target: Variant) -> int:
        return api_as(user).post("/api/v1/measurements/", {"variant": target.pk, "node": node},
                                 format="json").status_code

    # The stranger operates a team with no deployment of this model; nobody here has one of
    # the other model's.
    assert [measure(crew.viewer, variant), measure(crew.stranger, variant),
            measure(crew.operator, other)] == [403, 403, 403]
    assert not VariantMeasurement.objects.exists()
    assert measure(crew.operator, variant) == 202
    assert measure(owner, other) == 202
    assert actions("measurement.") == [("measurement.start", "otto"),
                                       ("measurement.start", "owner")]
    # Measurements are of shared variants: anyone signed in reads them.
    assert len(api_as(crew.stranger).get("/api/v1/measurements/").json()["results"]) == 2
    # Joining a team with a deployment of the model is what lets the stranger measure it.
    Membership.objects.create(team=crew.team, user=crew.stranger, role=Role.OPERATOR)
    VariantMeasurement.objects.all().delete()
    # (A fresh user object, as each request has: the old one holds its roles for its request.)
    assert measure(User.objects.get(pk=crew.stranger.pk), variant) == 202


def test_the_advice_panel_offers_measuring_to_operators(crew: Crew, running: Deployment,
                                                        tmp_path: Path) -> None:
    page = Client()
    page.force_login(crew.viewer)
    assert b"data-measure" not in page.get(f"/deployments/{running.name}/advice/").content
    variant = Variant.objects.get(base=running.base_model, name="bf16")
    assert page.post(f"/deployments/{running.name}/advice/measure/",
                     {"variant": variant.pk, "node": local_node().pk}).status_code == 403
    page.force_login(crew.operator)
    assert b"data-measure" in page.get(f"/deployments/{running.name}/advice/").content
