"""The P:D ratio band from the topology advisor (``POST .../autoscaling/ratio-band/from-advice/``):
the splits predicted within 5 % of the best split's goodput, for the load the advice takes; a
409 naming ``advice`` when there is none to draw from, a 400 naming a bad load field; only an
operator sets it, and it is audited as every band change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from console.accounts.models import Role, Team
from console.advisor.models import SpeedProfile
from console.audit.models import AuditEntry
from console.autoscaling.advised_band import BandRefused, ratios_of
from console.autoscaling.models import RatioBand
from console.deployments.models import Deployment
from console.fleet.models import Node
from tests.console.team_users import token_client
from tests.console.test_advisor import SPEEDS
from tests.console.tiny_models import make_plan

LOAD = {"rate_per_s": "2", "prompt_tokens": "256", "output_tokens": "32"}


@pytest.fixture
def team(db: None) -> Team:
    return Team.objects.create(name="banders")


@pytest.fixture
def plan(team: Team, tmp_path: Path) -> Deployment:
    deployment = make_plan(tmp_path, team=team)
    Node.objects.filter(pk=deployment.workers.get(role="decode").node_id).update(cpu_ids=[0, 1])
    return deployment


def measured(plan: Deployment) -> None:
    worker = plan.workers.get(role="decode")
    SpeedProfile.objects.create(node=worker.node, variant=worker.variant,
                                state=SpeedProfile.State.DONE, speeds=SPEEDS)


def url(plan: Deployment) -> str:
    return f"/api/v1/deployments/{plan.pk}/autoscaling/ratio-band/from-advice/"


def post(client: Client, plan: Deployment, body: dict[str, Any]) -> Any:
    return client.post(url(plan), data=body, content_type="application/json")


def test_an_operator_sets_the_band_from_the_advised_splits(team: Team, plan: Deployment) -> None:
    measured(plan)
    response = post(token_client(team, Role.OPERATOR, "op"), plan, LOAD)
    assert response.status_code == 200, response.content
    # Two cores: the one split is 1P:1D.
    assert response.json() == {"min_ratio": 1.0, "max_ratio": 1.0, "splits": ["PD 1P:1D"]}
    band = RatioBand.objects.get(deployment=plan)
    assert (band.min_ratio, band.max_ratio) == (1.0, 1.0)
    assert AuditEntry.objects.filter(action="autoscaling.ratio_band.update").count() == 1


def test_without_measured_speeds_it_is_a_409_and_no_band(team: Team, plan: Deployment) -> None:
    response = post(token_client(team, Role.OPERATOR, "op"), plan, LOAD)
    assert response.status_code == 409
    assert "no speeds" in " ".join(response.json()["advice"])
    assert not RatioBand.objects.exists()


def test_a_bad_load_is_a_400_naming_the_field_and_a_viewer_may_not(team: Team,
                                                                   plan: Deployment) -> None:
    measured(plan)
    bad = post(token_client(team, Role.OPERATOR, "op"), plan, {**LOAD, "rate_per_s": "-1"})
    assert bad.status_code == 400 and "rate_per_s" in bad.json()
    assert post(token_client(team, Role.VIEWER, "vi"), plan, LOAD).status_code == 403
    assert not RatioBand.objects.exists() and not AuditEntry.objects.filter(
        action__startswith="autoscaling").exists()


def split(prefill: int, decode: int, goodput: float) -> dict[str, Any]:
    return {"mode": "pd", "topology": f"PD {prefill}P:{decode}D", "goodput_rps": goodput,
            "servers": {"colocated": 0, "prefill": prefill, "decode": decode}}


def test_the_band_spans_the_splits_within_5_percent_of_the_best() -> None:
    advice = {"status": "advised", "devices": 8, "candidates": [
        {"mode": "colocated", "topology": "colocated x8", "goodput_rps": 9.0,
         "servers": {"colocated": 8, "prefill": 0, "decode": 0}},
        split(1, 3, 6.0), split(2, 2, 5.8), split(1, 1, 5.0), split(3, 1, 5.71)]}
    assert ratios_of(advice) == (1 / 3, 3.0, ["PD 1P:3D", "PD 2P:2D", "PD 3P:1D"])
    with pytest.raises(BandRefused, match="no P:D split meets the SLOs"):
        ratios_of({**advice, "candidates": [split(1, 1, 0.0), split(1, 2, 0.0)]})
    with pytest.raises(BandRefused, match="allow no P:D split"):
        ratios_of({**advice, "candidates": advice["candidates"][:1]})
