"""The catalog is shared by every team: anyone signed in reads models and variants, only a
superuser adds, edits, removes or re-inspects them, and each change writes one audit entry."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.catalog.models import BaseModel, Variant
from console.deployments.models import Deployment
from tests.console.team_users import Crew, actions, api_as, make_crew
from tests.console.tiny_models import register, write_model


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def variant(db: None, tmp_path: Path) -> Variant:
    return register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")


def test_members_read_the_catalog_but_change_nothing(crew: Crew, variant: Variant,
                                                      tmp_path: Path) -> None:
    before = actions()
    for user in (crew.viewer, crew.admin, crew.stranger):
        api = api_as(user)
        assert api.get("/api/v1/models/").status_code == 200
        assert api.get(f"/api/v1/variants/{variant.pk}/").status_code == 200
        refused = [
            api.post("/api/v1/models/", {"name": "other"}, format="json"),
            api.patch(f"/api/v1/models/{variant.base_id}/", {"description": "x"}, format="json"),
            api.delete(f"/api/v1/models/{variant.base_id}/"),
            api.post("/api/v1/variants/", {"base_model": "tiny", "name": "copy",
                                           "path": str(write_model(tmp_path / "copy"))},
                     format="json"),
            api.patch(f"/api/v1/variants/{variant.pk}/", {"name": "renamed"}, format="json"),
            api.delete(f"/api/v1/variants/{variant.pk}/"),
            api.post(f"/api/v1/variants/{variant.pk}/inspect/"),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused), user
    assert api_as(None).get("/api/v1/models/").status_code == 401
    assert actions() == before
    assert Variant.objects.get(pk=variant.pk).name == "bf16"


def test_each_superuser_change_writes_one_entry(owner: User, variant: Variant,
                                                tmp_path: Path) -> None:
    api = api_as(owner)
    before = len(actions())
    made = api.post("/api/v1/models/", {"name": "other"}, format="json")
    assert made.status_code == 201
    assert api.patch(f"/api/v1/models/{made.json()['id']}/", {"description": "a second model"},
                     format="json").status_code == 200
    copy = api.post("/api/v1/variants/", {"base_model": "other", "name": "bf16",
                                          "path": str(write_model(tmp_path / "copy"))},
                    format="json")
    assert copy.status_code == 201
    assert api.patch(f"/api/v1/variants/{copy.json()['id']}/", {"name": "first"},
                     format="json").json()["name"] == "first"
    assert api.post(f"/api/v1/variants/{copy.json()['id']}/inspect/").status_code == 200
    # Still used by its variant: refused, and nothing recorded.
    assert api.delete(f"/api/v1/models/{made.json()['id']}/").status_code == 409
    assert api.delete(f"/api/v1/variants/{copy.json()['id']}/").status_code == 204
    assert api.delete(f"/api/v1/models/{made.json()['id']}/").status_code == 204
    assert actions()[before:] == [
        ("model.create", "owner"), ("model.edit", "owner"), ("variant.create", "owner"),
        ("variant.edit", "owner"), ("variant.reinspect", "owner"), ("variant.delete", "owner"),
        ("model.delete", "owner")]


def test_a_variant_a_plan_uses_is_not_deleted(owner: User, deployment: Deployment) -> None:
    used = deployment.workers.first().variant
    response = api_as(owner).delete(f"/api/v1/variants/{used.pk}/")
    assert response.status_code == 409
    assert deployment.name in response.json()["detail"]
    assert Variant.objects.filter(pk=used.pk).exists()


def test_a_rename_to_a_taken_name_is_a_400_naming_the_field(owner: User, variant: Variant,
                                                            tmp_path: Path) -> None:
    other = register(variant.base, tmp_path, "int8")
    response = api_as(owner).patch(f"/api/v1/variants/{other.pk}/", {"name": "bf16"},
                                   format="json")
    assert response.status_code == 400
    assert response.json(), "names what is wrong"


def test_the_page_offers_changes_to_a_superuser_only(crew: Crew, owner: User,
                                                     variant: Variant) -> None:
    page = Client()
    page.force_login(crew.admin)
    html = page.get("/models/").content.decode()
    assert 'id="register-form"' not in html and "Re-inspect" not in html
    assert page.post(f"/models/variants/{variant.pk}/inspect/").status_code == 403
    assert page.post("/models/new/", {"base-name": "other"}).status_code == 403
    assert not BaseModel.objects.filter(name="other").exists()
    page.force_login(owner)
    html = page.get("/models/").content.decode()
    assert 'id="register-form"' in html and "Re-inspect" in html
    assert page.post("/models/new/", {"base-name": "other"}).status_code == 302
    assert actions()[-1] == ("model.create", "owner")
    assert Client().get("/models/").status_code == 302
