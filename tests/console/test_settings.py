"""console/env.py: typed environment readers whose errors name the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from console.env import env_bool, env_int, env_list, env_path, env_secret, env_str

VAR = "PDSERVE_TEST_VALUE"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.delenv(f"{VAR}_FILE", raising=False)


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " True "])
def test_env_bool_true(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "off"])
def test_env_bool_false(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, True) is False


def test_env_bool_unset_or_empty_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_bool(VAR, True) is True
    monkeypatch.setenv(VAR, "")
    assert env_bool(VAR, True) is True
    assert env_bool(VAR, False) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "enabled"])
def test_env_bool_rejects_other_words(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=f"^{VAR}: .*{raw!r}"):
        env_bool(VAR)


def test_env_int_parses_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_int(VAR, 8080) == 8080
    monkeypatch.setenv(VAR, "")
    assert env_int(VAR, 8080) == 8080
    monkeypatch.setenv(VAR, "9090")
    assert env_int(VAR, 8080, 1, 65535) == 9090
    # The bounds are inclusive.
    monkeypatch.setenv(VAR, "65535")
    assert env_int(VAR, 8080, 1, 65535) == 65535


@pytest.mark.parametrize("raw", ["eighty", "80.5", "0x50"])
def test_env_int_rejects_non_integers(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=f"^{VAR}: expected an integer"):
        env_int(VAR, 1)


@pytest.mark.parametrize(("raw", "minimum", "maximum", "message"),
                         [("0", 1, 65535, "is below the minimum 1"),
                          ("65536", 1, 65535, "is above the maximum 65535"),
                          ("-5", 0, None, "is below the minimum 0"),
                          ("11", None, 10, "is above the maximum 10")])
def test_env_int_rejects_values_out_of_range(monkeypatch: pytest.MonkeyPatch, raw: str,
                                             minimum: int | None, maximum: int | None,
                                             message: str) -> None:
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=f"^{VAR}: {raw} {message}$"):
        env_int(VAR, 1, minimum, maximum)


def test_env_secret_reads_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_secret(VAR) == ""
    assert env_secret(VAR, "fallback") == "fallback"
    monkeypatch.setenv(VAR, "s3cret")
    assert env_secret(VAR) == "s3cret"


def test_env_secret_prefers_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    # Mounted secrets usually end with a newline that is not part of the secret.
    secret_file.write_text("from-file\n")
    monkeypatch.setenv(VAR, "from-variable")
    monkeypatch.setenv(f"{VAR}_FILE", str(secret_file))
    assert env_secret(VAR) == "from-file"


def test_env_secret_unreadable_file_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    monkeypatch.setenv(f"{VAR}_FILE", str(missing))
    with pytest.raises(ImproperlyConfigured, match=f"^{VAR}_FILE: cannot read {missing}"):
        env_secret(VAR)


def test_env_str_list_and_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert env_str(VAR, "d") == "d"
    assert env_list(VAR, ["a"]) == ["a"]
    monkeypatch.setenv(VAR, " a, b ,,c ")
    assert env_list(VAR, []) == ["a", "b", "c"]
    assert env_str(VAR) == " a, b ,,c "
    # An explicitly empty list is different from an unset one.
    monkeypatch.setenv(VAR, "")
    assert env_list(VAR, ["a"]) == []
    assert env_path(VAR, tmp_path / "x" / ".." / "y") == (tmp_path / "y").resolve()
    monkeypatch.setenv(VAR, str(tmp_path / "z" / ".." / "w"))
    assert env_path(VAR, Path("/unused")) == (tmp_path / "w").resolve()


def _load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Import the settings module in a fresh interpreter with the given environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PDSERVE_", "DATABASE_URL",
                                                                       "REDIS_URL"))}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
                               "print(settings.DEBUG, settings.PDSERVE_ROUTER_PORT)"],
        env={**clean, "DJANGO_SETTINGS_MODULE": "console.settings",
             "PDSERVE_DATA_DIR": str(tmp_path), **env},
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )


def test_settings_module_reports_the_bad_variable(tmp_path: Path) -> None:
    good = _load_settings(tmp_path, PDSERVE_DEBUG="yes", PDSERVE_ROUTER_PORT="9099")
    assert good.returncode == 0, good.stderr
    assert good.stdout.split() == ["True", "9099"]

    bad = _load_settings(tmp_path, PDSERVE_ROUTER_PORT="http")
    assert bad.returncode != 0
    assert "ImproperlyConfigured: PDSERVE_ROUTER_PORT: expected an integer, got 'http'" in bad.stderr


def test_settings_generate_a_secret_key_once_per_data_dir(tmp_path: Path) -> None:
    first = _load_settings(tmp_path)
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "secret_key"
    key = key_file.read_text()
    assert len(key) >= 40
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert _load_settings(tmp_path).returncode == 0
    assert key_file.read_text() == key
