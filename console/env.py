"""Typed readers for environment variables; a bad value names the variable."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_secret(name: str, default: str = "") -> str:
    """Read NAME, or the file named by NAME_FILE (for secrets mounted as files)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name}: {exc}") from exc
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}: expected a boolean (1/0, true/false), got {raw!r}")


def env_int(name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: expected an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}: {value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}: {value} is above the maximum {maximum}")
    return value


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default.resolve()


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    return value


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def env_networks(name: str) -> tuple[IPNetwork, ...]:
    """A comma-separated list of networks (``127.0.0.1/32,10.0.0.0/8,fd00::/8``; a bare address
    is its own /32 or /128); empty or unset: none."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network ({exc})") from exc
    return tuple(networks)
