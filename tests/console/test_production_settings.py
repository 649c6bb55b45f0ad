"""PDSERVE_ENV=production: `manage.py check --deploy` is clean with the environment the README
names, and the console refuses to start without a secret key or host names; development keeps
its defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management.utils import get_random_secret_key

PRODUCTION = {"PDSERVE_ENV": "production", "PDSERVE_SECRET_KEY": get_random_secret_key(),
              "PDSERVE_ALLOWED_HOSTS": "console.example.com"}


def run(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``python args`` in the repository with only the given pdserve variables set."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PDSERVE_", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"))}
    return subprocess.run([sys.executable, *args], cwd=settings.BASE_DIR,
                          env={**clean, "PDSERVE_DATA_DIR": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=120)


def check_deploy(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run(tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **env)


def start(tmp_path: Path, names: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """Set Django up as the console does, and print the settings ``names``."""
    program = ("import django; django.setup(); from django.conf import settings; "
               f"[print(repr(getattr(settings, name, None))) for name in {names!r}]")
    return run(tmp_path, ["-c", program], DJANGO_SETTINGS_MODULE="console.settings", **env)


def setting_values(tmp_path: Path, names: list[str], **env: str) -> list[str]:
    result = start(tmp_path, names, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_check_deploy_is_clean_in_production(tmp_path: Path) -> None:
    result = check_deploy(tmp_path, **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_check_deploy_fails_on_a_warning(tmp_path: Path) -> None:
    # The same check on plain HTTP: proof that a warning fails it, so the clean run means clean.
    result = check_deploy(tmp_path, **PRODUCTION, PDSERVE_TLS="0")
    assert result.returncode != 0
    assert "security.W012" in result.stderr and "security.W004" in result.stderr


@pytest.mark.parametrize(("missing", "message"), [
    ("PDSERVE_SECRET_KEY", "PDSERVE_SECRET_KEY: required with PDSERVE_ENV=production"),
    ("PDSERVE_ALLOWED_HOSTS", "PDSERVE_ALLOWED_HOSTS: required with PDSERVE_ENV=production"),
])
def test_production_refuses_to_start_without(tmp_path: Path, missing: str, message: str) -> None:
    env = {name: value for name, value in PRODUCTION.items() if name != missing}
    result = start(tmp_path, [], **env)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr
    # Nothing generated in its place.
    assert not (tmp_path / "secret_key").exists()


def test_the_secret_key_can_come_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(PRODUCTION["PDSERVE_SECRET_KEY"] + "\n")
    env = {**PRODUCTION, "PDSERVE_SECRET_KEY_FILE": str(key_file)}
    del env["PDSERVE_SECRET_KEY"]
    assert setting_values(tmp_path, ["SECRET_KEY"], **env) == [repr(PRODUCTION["PDSERVE_SECRET_KEY"])]


def test_an_unknown_environment_is_refused_naming_the_variable(tmp_path: Path) -> None:
    result = start(tmp_path, [], PDSERVE_ENV="staging")
    assert result.returncode != 0
    assert "PDSERVE_ENV: expected development or production, got 'staging'" in result.stderr


def test_production_reads_hosts_origins_hsts_and_the_proxy_from_the_environment(tmp_path: Path) -> None:
    names = ["ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "SECURE_HSTS_SECONDS",
             "SECURE_PROXY_SSL_HEADER", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"]
    values = setting_values(tmp_path, names, **{
        **PRODUCTION, "PDSERVE_ALLOWED_HOSTS": "console.example.com,pdserve.internal",
        "PDSERVE_CSRF_TRUSTED_ORIGINS": "https://console.example.com:8443",
        "PDSERVE_HSTS_SECONDS": "600", "PDSERVE_BEHIND_PROXY": "1"})
    assert values == ["['console.example.com', 'pdserve.internal']",
                      "['https://console.example.com:8443']", "600",
                      "('HTTP_X_FORWARDED_PROTO', 'https')", "True", "True"]
    # Without being told of a proxy, Django trusts no forwarded header of its own.
    assert setting_values(tmp_path, ["SECURE_PROXY_SSL_HEADER"], **PRODUCTION) == ["None"]


def test_development_keeps_its_defaults(tmp_path: Path) -> None:
    names = ["ALLOWED_HOSTS", "SESSION_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_SSL_REDIRECT"]
    assert setting_values(tmp_path, names) == [
        "['127.0.0.1', 'localhost', 'testserver']", "False", "0", "False"]
    # The secret key is generated into the data directory, as before.
    assert (tmp_path / "secret_key").is_file()
