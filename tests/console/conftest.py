"""Shared fixtures for the console tests: two users, the default deployment plan and the tiny
vision-language models."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.deployments.defaults import ensure_default_deployment
from console.deployments.models import Deployment
from tests.console.passwords import OUTSIDER_PASSWORD, OWNER_PASSWORD
from tests.console.tokens import token_for
from tests.tiny_vlm import BUILDERS, SHARED_ROOT, shared_tiny_vlm

# The default model's directory, whose tokenizer the tiny VLMs take (as tests/borrowed.py's).
SMOLLM2 = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR", SHARED_ROOT / "smollm2-135m-instruct"))


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # The production hasher is slow on purpose (PBKDF2, a million rounds); tests hash dozens.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_gateway(settings: Any) -> None:
    # Settings were read before tests/conftest.py turned the gateway off for the processes
    # tests start: off here too, or every supervisor a test ticks would start one on 8090.
    # tests/console/test_gateway_process.py turns it on, on a port of its own.
    settings.PDSERVE_GATEWAY_PORT = 0


@pytest.fixture(autouse=True)
def no_verification_after_start(settings: Any) -> None:
    # Likewise: new plans do not verify themselves after a start (tests/conftest.py says why);
    # tests/console/test_verify_after_ready.py turns it on for its plans.
    settings.PDSERVE_VERIFY_AFTER_START = False


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
