"""Shared fixtures for the console tests: two users, the default deployment plan and the tiny
vision-language models."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import override_settings
from rest_framework.test import APIClient

from console.deployments.defaults import ensure_default_deployment
from console.deployments.models import Deployment
from tests.console.passwords import OUTSIDER_PASSWORD, OWNER_PASSWORD
from tests.console.tokens import token_for
from tests.console.world import World, build_world
from tests.tiny_vlm import BUILDERS, SHARED_ROOT, shared_tiny_vlm

# The default model's directory, whose tokenizer the tiny VLMs take (as tests/borrowed.py's).
SMOLLM2 = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR", SHARED_ROOT / "smollm2-135m-instruct"))


# What every console test runs with, set per test below and for the module-wide world's build:
# - the production hasher is slow on purpose (PBKDF2, a million rounds); tests hash dozens;
# - settings were read before tests/conftest.py turned the gateway off for the processes tests
#   start: off here too, or every supervisor a test ticks would start one on 8090
#   (tests/console/test_gateway_process.py turns it on, on a port of its own);
# - likewise new plans do not verify themselves after a start (tests/conftest.py says why;
#   tests/console/test_verify_after_ready.py turns it on for its plans).
CONSOLE_TEST_SETTINGS: dict[str, Any] = {
    "PASSWORD_HASHERS": ["django.contrib.auth.hashers.MD5PasswordHasher"],
    "PDSERVE_GATEWAY_PORT": 0,
    "PDSERVE_VERIFY_AFTER_START": False,
}


@pytest.fixture(autouse=True)
def console_test_settings(settings: Any) -> None:
    for name, value in CONSOLE_TEST_SETTINGS.items():
        setattr(settings, name, value)


@pytest.fixture
def owner(db: None) -> User:
    """The operator, created the way `manage.py bootstrap` creates the admin."""
    return User.objects.create_superuser(username="owner", email="", password=OWNER_PASSWORD)


@pytest.fixture
def api(owner: User) -> APIClient:
    """The REST API as the owner (a superuser), signed in without a token."""
    client = APIClient()
    client.force_authenticate(owner)
    return client


@pytest.fixture
def outsider(db: None) -> User:
    """Someone who once had an account that has since been deactivated.

    A disabled account is the realistic outsider of a single-operator console: it has a row,
    a password and even a token left over, and none of them may open anything.
    """
    user = User.objects.create_user(username="outsider", password=OUTSIDER_PASSWORD)
    token_for(user, "left over")
    user.is_active = False
    user.save(update_fields=["is_active"])
    return user


@pytest.fixture
def deployment(db: None, tmp_path: Path) -> Deployment:
    # The model directory is only stored as a path; nothing reads it in these tests.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    created, _ = ensure_default_deployment(model_dir=model_dir)
    return created


@pytest.fixture(scope="session")
def tiny_vlms() -> dict[str, Path]:
    """The random-weight VLMs of tests/tiny_vlm.py (name -> directory), built once a machine
    at data/models/<name> (as tests/tiny_llama.py's shared model): a few seconds the first time.
    Tests that change one copy it first."""
    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.fail(f"{SMOLLM2} is not prepared: run `make model` (the VLMs use its tokenizer)")
    return {name: shared_tiny_vlm(SMOLLM2, name) for name in sorted(BUILDERS)}


@pytest.fixture(scope="module")
def module_world(django_db_setup: None, django_db_blocker: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """tests/console/world.py's world, built once per module inside a transaction that is
    rolled back after the module's last test. Each test's own transaction (the `db` fixture)
    is then a savepoint inside it, so what a test changes is undone before the next. Built per
    test it cost 0.11 s on SQLite, 800 times a run."""
    # The autouse settings are function-scoped and not yet applied here: the same ones for the
    # build (a plan made with verification after start on would verify on its start).
    with override_settings(**CONSOLE_TEST_SETTINGS), django_db_blocker.unblock(), \
            transaction.atomic():
        yield build_world(tmp_path_factory.mktemp("world"))
        transaction.set_rollback(True)


@pytest.fixture
def world(module_world: World, db: None) -> World:
    """The module's world, its objects copied: a test that changes one in memory leaves the
    next test's copy as the database has it."""
    return copy.deepcopy(module_world)
