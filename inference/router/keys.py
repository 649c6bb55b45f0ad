"""The inference API keys the router accepts, as the console describes them (never the secrets).

A key looks like ``pds_<prefix>_<secret>``: the 8-character prefix is public (the console lists
it) and finds the entry; the SHA-256 of the whole key is compared in constant time. The secret is
32 random bytes, so a plain SHA-256 is enough: there is nothing to brute-force.

The key set arrives as JSON, from ``--keys-file`` at start and from ``PUT /admin/keys`` at run
time (see keys_admin.py)::

    {"version": "...", "require_key": true,
     "keys": [{"id": 3, "prefix": "ab12cd34", "hash": "<sha256 hex>", "state": "active",
               "limits": {"requests_per_minute": 60, "prompt_tokens_per_minute": null,
                          "generated_tokens_per_minute": 10000, "max_concurrency": 4},
               "model_limits": {"big": {"requests_per_minute": 5}},
               "team": 2,
               "budget": {"tokens": 1000000, "period": "month", "period_start": "2026-12-01",
                          "spent": 52000, "spent_here": 12000}}],
     "teams": {"2": {"tokens": 5000000, "period": "day", "period_start": "2026-12-04",
                     "spent": 0, "spent_here": 0}}}

``state`` is ``active``, ``revoked`` or ``out_of_scope`` (a key of another deployment): the
router answers 401 to the last two but can say why. ``require_key`` false with no legacy
``PDSERVE_API_KEY`` leaves the router open, as before keys existed.

``model_limits`` (optional) overrides limits on one model, by served model name: on the router
serving that model, each limit it names (null: unlimited there) replaces the key's and is counted
apart, per key and model; the limits it does not name stay the key's own, counted across models.
``team``, ``budget`` and ``teams`` are the token budgets, see budgets.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from inference.router.budgets import Budget, parse_budget
from inference.router.errors import RequestError

Parsed = TypeVar("Parsed")

KEY_PREFIX = "pds_"
PREFIX_LEN = 8
STATES = ("active", "revoked", "out_of_scope")
LIMIT_NAMES = ("requests_per_minute", "prompt_tokens_per_minute", "generated_tokens_per_minute",
               "max_concurrency")


def new_key() -> str:
    """A fresh key: ``pds_`` + 8 hex characters (public) + ``_`` + 43 characters of secret."""
    return f"{KEY_PREFIX}{secrets.token_hex(PREFIX_LEN // 2)}_{secrets.token_urlsafe(32)}"


# The id of the console's own key (the playground's, the verification's) in every key set the
# console pushes, and so in each router's usage ledger.
CONSOLE_KEY_ID = "console"

def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def public_prefix(key: str) -> str | None:
    """The prefix of a well-formed ``pds_<prefix>_<secret>`` key, else None."""
    if not key.startswith(KEY_PREFIX) or len(key) < len(KEY_PREFIX) + PREFIX_LEN + 2:
        return None
    prefix = key[len(KEY_PREFIX):len(KEY_PREFIX) + PREFIX_LEN]
    return prefix if key[len(KEY_PREFIX) + PREFIX_LEN] == "_" else None


@dataclass(frozen=True)
class Limits:
    """Per-key limits; None is unlimited."""

    requests_per_minute: int | None = None
    prompt_tokens_per_minute: int | None = None
    generated_tokens_per_minute: int | None = None
    max_concurrency: int | None = None

    @property
    def any(self) -> bool:
        return any(getattr(self, name) is not None for name in LIMIT_NAMES)


@dataclass
class KeyUsage:
    """What the router saw of one key since it started (reported by ``GET /admin/keys/usage``)."""

    last_used: float | None = None  # Unix time
    requests: int = 0
    rate_limited: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"last_used": self.last_used, "requests": self.requests,
                "rate_limited": self.rate_limited, "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens}


NOT_SCOPED = (False, False, False, False)


@dataclass(frozen=True)
class ApiKey:
    id: str
    prefix: str
    hash: str
    state: str
    # The limits on this router's model: the key's, with the model's override applied.
    limits: Limits
    usage: KeyUsage = field(default_factory=KeyUsage, compare=False)
    # Per limit of LIMIT_NAMES: whether it is the model's own (counted per key and ``model``).
    model_scoped: tuple[bool, bool, bool, bool] = NOT_SCOPED
    model: str = ""
    model_limits: dict[str, dict[str, int | None]] = field(default_factory=dict, compare=False)
    team: str = ""
    budget: Budget | None = None
    team_budget: Budget | None = None

    @property
    def label(self) -> str:
        """The metrics label: the public prefix, never the secret."""
        return KEY_PREFIX + self.prefix


@dataclass(frozen=True)
class KeySet:
    version: str = ""
    require_key: bool = False
    by_prefix: dict[str, ApiKey] = field(default_factory=dict)
    teams: dict[str, Budget] = field(default_factory=dict)

    @property
    def keys(self) -> list[ApiKey]:
        return list(self.by_prefix.values())


def parse_key_set(data: Any, previous: KeySet | None = None, model: str = "") -> KeySet:
    """Validate a key set; raises RequestError naming the offending field. ``model``: the served
    model name of the router, whose entry of each key's ``model_limits`` applies.

    Usage counters of keys that stay carry over from ``previous``, so a push loses no counts.
    """
    if not isinstance(data, dict):
        raise RequestError(400, "the key set must be a JSON object", param="keys")
    version = data.get("version", "")
    if not isinstance(version, str):
        raise RequestError(400, "'version' must be a string", param="version")
    require_key = data.get("require_key", False)
    if not isinstance(require_key, bool):
        raise RequestError(400, "'require_key' must be a boolean", param="require_key")
    entries = data.get("keys")
    if not isinstance(entries, list):
        raise RequestError(400, "'keys' must be a list", param="keys")
    teams = data.get("teams") or {}
    if not isinstance(teams, dict):
        raise RequestError(400, "'teams' must be an object", param="teams")
    team_budgets = {str(team): parse_budget(budget, f"teams.{team}")
                    for team, budget in teams.items()}
    old = previous.by_prefix if previous is not None else {}
    by_prefix: dict[str, ApiKey] = {}
    for index, entry in enumerate(entries):
        where = f"keys[{index}]"
        if not isinstance(entry, dict):
            raise RequestError(400, f"'{where}' must be an object", param=where)
        key_id, prefix, digest, state = key_entry(entry, where, STATES, set(by_prefix))
        own = _limit_values(entry.get("limits") or {}, f"{where}.limits")
        overrides = entry.get("model_limits") or {}
        if not isinstance(overrides, dict):
            raise RequestError(400, f"'{where}.model_limits' must be an object",
                               param=f"{where}.model_limits")
        model_limits = {str(name): _limit_values(values, f"{where}.model_limits.{name}",
                                                 partial=True)
                        for name, values in overrides.items()}
        override = model_limits.get(model, {}) if model else {}
        scoped = ("requests_per_minute" in override, "prompt_tokens_per_minute" in override,
                  "generated_tokens_per_minute" in override, "max_concurrency" in override)
        team = entry.get("team", "")
        if not isinstance(team, (int, str)) or isinstance(team, bool):
            raise RequestError(400, f"'{where}.team' must be an integer or a string",
                               param=f"{where}.team")
        budget = entry.get("budget")
        usage = old[prefix].usage if prefix in old and old[prefix].id == key_id else KeyUsage()
        by_prefix[prefix] = ApiKey(
            key_id, prefix, digest, state, Limits(**{**own, **override}), usage,
            model_scoped=scoped, model=model if any(scoped) else "",
            model_limits=model_limits, team=str(team),
            budget=parse_budget(budget, f"{where}.budget") if budget is not None else None,
            team_budget=team_budgets.get(str(team)))
    return KeySet(version, require_key, by_prefix, team_budgets)


HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def key_entry(entry: dict[str, Any], where: str, states: tuple[str, ...],
              taken: set[str]) -> tuple[str, str, str, str]:
    """A key entry's id, prefix, lower-case hash and state, as the console describes a key to a
    router and to the gateway; raises RequestError naming the field. ``taken``: the prefixes of
    the entries before it. A missing state is ``active``."""
    key_id = entry.get("id")
    if not isinstance(key_id, (int, str)) or isinstance(key_id, bool) or key_id == "":
        raise RequestError(400, f"'{where}.id' must be an integer or a string", param=f"{where}.id")
    prefix = entry.get("prefix")
    if not isinstance(prefix, str) or len(prefix) != PREFIX_LEN or "_" in prefix:
        raise RequestError(400, f"'{where}.prefix' must be {PREFIX_LEN} characters without '_'",
                           param=f"{where}.prefix")
    if prefix in taken:
        raise RequestError(400, f"'{where}.prefix' {prefix!r} appears twice", param=f"{where}.prefix")
    digest = entry.get("hash")
    if not isinstance(digest, str) or len(digest) != 64 or not HEX_DIGITS.issuperset(digest):
        raise RequestError(400, f"'{where}.hash' must be a SHA-256 hex digest", param=f"{where}.hash")
    state = entry.get("state", "active")
    if state not in states:
        raise RequestError(400, f"'{where}.state' must be one of {', '.join(states)}",
                           param=f"{where}.state")
    return str(key_id), prefix, digest.lower(), state


def _limit_values(data: Any, where: str, partial: bool = False) -> dict[str, int | None]:
    """The limits of ``data`` by name; with ``partial`` only those it names, else all of them
    (a missing one is None, unlimited)."""
    if not isinstance(data, dict):
        raise RequestError(400, f"'{where}' must be an object", param=where)
    unknown = sorted(set(data) - set(LIMIT_NAMES))
    if unknown:
        raise RequestError(400, f"'{where}.{unknown[0]}' is not a limit (one of {', '.join(LIMIT_NAMES)})",
                           param=f"{where}.{unknown[0]}")
    values: dict[str, int | None] = {}
    for name in LIMIT_NAMES:
        if partial and name not in data:
            continue
        value = data.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise RequestError(400, f"'{where}.{name}' must be a positive integer or null",
                               param=f"{where}.{name}")
        values[name] = value
    return values


def load_key_file(path: str | Path, model: str = "") -> KeySet:
    """The key set in ``path`` (limits resolved for ``model``); ValueError saying what is wrong
    with it."""
    return load_console_file(path, "--keys-file", lambda data: parse_key_set(data, model=model))


def load_console_file(path: str | Path, flag: str, parse: Callable[[Any], Parsed]) -> Parsed:
    """A JSON file the console writes for a process to start with (a router's key set, the
    gateway's configuration), checked by ``parse``; ValueError naming ``flag``, the file and
    what is wrong."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{flag}: {path} is not JSON: {exc}") from exc
    try:
        return parse(data)
    except RequestError as exc:
        where = f" (at {exc.param})" if exc.param else ""
        raise ValueError(f"{flag}: {path}: {exc.message}{where}") from exc


class AuthFailure(Exception):
    """Why a request's key was refused: ``reason`` is a bounded metrics label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class Gatekeeper:
    """Decides who may call ``/v1/*``: the key set from the console and the legacy single key."""

    def __init__(self, key_set: KeySet | None = None, legacy_key: str | None = None,
                 model: str = "", on_replace: Callable[[KeySet], None] | None = None):
        """``model``: the router's served model name, whose per-model limits apply here;
        ``on_replace``: told each new key set (the budgets follow its keys' teams)."""
        self.key_set = key_set or KeySet()
        self.legacy = f"Bearer {legacy_key}".encode() if legacy_key else None
        self.model = model
        self.on_replace = on_replace

    @property
    def open(self) -> bool:
        return self.legacy is None and not self.key_set.require_key

    def replace(self, data: Any) -> KeySet:
        """Swap the key set in one assignment: a request sees the old set or the new, never a mix.
        Requests in flight keep the key they were admitted with."""
        self.key_set = parse_key_set(data, self.key_set, self.model)
        if self.on_replace is not None:
            self.on_replace(self.key_set)
        return self.key_set

    def check(self, authorization: str) -> ApiKey | None:
        """The caller's key; None when no key is needed or the legacy key was sent.
        Raises AuthFailure."""
        # hot path: runs once per request
        if not authorization:
            if self.open:
                return None
            raise AuthFailure("missing", "missing API key (send 'Authorization: Bearer <key>')")
        supplied = authorization.encode("utf-8", "surrogateescape")
        if self.legacy is not None and hmac.compare_digest(supplied, self.legacy):
            return None
        token = authorization[7:] if authorization[:7].lower() == "bearer " else ""
        prefix = public_prefix(token)
        entry = self.key_set.by_prefix.get(prefix) if prefix else None
        if entry is None or not hmac.compare_digest(key_hash(token), entry.hash):
            if self.open:
                # An open router ignores what it cannot check, as it did before keys existed.
                return None
            raise AuthFailure("invalid", "invalid API key")
        if entry.state != "active":
            if self.open:
                return None
            if entry.state == "revoked":
                raise AuthFailure("revoked", f"API key {entry.label}... has been revoked")
            raise AuthFailure("out_of_scope",
                              f"API key {entry.label}... is not valid for this deployment")
        entry.usage.last_used = time.time()
        entry.usage.requests += 1
        return entry

    def usage(self) -> dict[str, Any]:
        return {"version": self.key_set.version,
                "keys": {key.id: key.usage.as_dict() for key in self.key_set.keys}}
