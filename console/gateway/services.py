"""API keys: create (the secret returned once), update, revoke, and the key set each
deployment's router receives (hashes, states, limits; never a secret)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.accounts.models import Team
from console.audit.entries import record, snapshot
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.models import LIMIT_FIELDS, ApiKey
from console.gateway.private_files import write_private
from console.gateway.router_admin import CONSOLE_KEY_ID, console_key, push_keys
from console.gateway.routes_config import gateway_config, in_scope
from inference.router.keys import key_hash, new_key, public_prefix

# What the audit log shows of a key: never its hash.
KEY_FIELDS = ("name", "team", "all_deployments", "deployments", *LIMIT_FIELDS, "revoked_at")


def scope_errors(team: Team, deployments: Iterable[Deployment]) -> dict[str, str]:
    """A key opens only deployments of its own team."""
    foreign = sorted(d.name for d in deployments if d.team_id != team.pk)
    if foreign:
        return {"deployments": f"not of team {team.name}: {', '.join(foreign)}"}
    return {}


def create_key(*, name: str, team: Team, deployments: Iterable[Deployment], all_deployments: bool,
               limits: dict[str, int | None], user: AbstractBaseUser | None) -> tuple[ApiKey, str]:
    """A new key and its secret, which is not stored and cannot be shown again."""
    deployments = list(deployments)
    for _attempt in range(5):
        secret = new_key()
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    name=name, team=team, prefix=public_prefix(secret), key_hash=key_hash(secret),
                    all_deployments=all_deployments,
                    created_by=user if user is not None and user.is_authenticated else None,
                    **{field: limits.get(field) for field in LIMIT_FIELDS})
                key.deployments.set(deployments)
                record("key.create", key, after=snapshot(key, KEY_FIELDS))
        except IntegrityError:
            continue  # a prefix already taken (1 in 4 billion per key): draw again
        keys_changed()
        return key, secret
    raise RuntimeError("could not draw an unused key prefix")


@transaction.atomic
def update_key(key: ApiKey, changes: dict[str, Any]) -> ApiKey:
    before = snapshot(key, KEY_FIELDS)
    deployments = changes.pop("deployments", None)
    for name, value in changes.items():
        setattr(key, name, value)
    key.save()
    if deployments is not None:
        key.deployments.set(list(deployments))
    record("key.edit", key, before=before, after=snapshot(key, KEY_FIELDS))
    keys_changed()
    return key


@transaction.atomic
def revoke_key(key: ApiKey) -> ApiKey:
    """Revoked from the next request on; revoking twice keeps the first time."""
    before = snapshot(key, ("revoked_at",))
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        keys_changed()
    record("key.revoke", key, before=before, after=snapshot(key, ("revoked_at",)))
    return key


def keys_changed() -> None:
    """Once the change is committed: rewrite every deployment's key file (read by a router at
    start) and push the new sets to the routers running now."""
    transaction.on_commit(_publish)


def _publish() -> None:
    for deployment in Deployment.objects.all():
        write_keys_file(deployment)
        push_keys(deployment, key_set(deployment))
    publish_gateway_config()


def gateway_changed() -> None:
    """Once the change (an alias, a key) is committed: tell the gateway now rather than at the
    sync's next round."""
    transaction.on_commit(publish_gateway_config)


def publish_gateway_config() -> None:
    if not gateway_process.enabled():
        return
    config = gateway_config()
    gateway_process.write_config(config)
    gateway_process.push_config(config)


def key_set(deployment: Deployment) -> dict[str, Any]:
    """What ``deployment``'s router is told (see inference/router/keys.py).

    Keys of other deployments are listed as out of scope so that the router can say why it
    refuses them. A key is required as soon as any key, even a revoked one, was made for this
    deployment: revoking a leaked last key must not open the router.
    """
    keys = list(ApiKey.objects.prefetch_related("deployments").order_by("pk"))
    entries = []
    for key in keys:
        scoped = in_scope(key, deployment)
        state = "revoked" if key.revoked else "active" if scoped else "out_of_scope"
        entries.append({"id": key.pk, "prefix": key.prefix, "hash": key.key_hash, "state": state,
                        "limits": key.limits()})
    own = console_key(deployment)
    # The console's own key (the playground's), derived from the secret key, never stored.
    entries.append({"id": CONSOLE_KEY_ID, "prefix": public_prefix(own), "hash": key_hash(own),
                    "state": "active", "limits": {}})
    body = {"require_key": any(in_scope(key, deployment) for key in keys), "keys": entries}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": digest, **body}


def keys_file_path(deployment: Deployment) -> Path:
    return Path(settings.DATA_DIR) / "keys" / f"{deployment.name}.json"


def write_keys_file(deployment: Deployment) -> Path:
    """Write the key set where the router reads it at start."""
    return write_private(keys_file_path(deployment), json.dumps(key_set(deployment)))


def record_usage(usage: dict[str, Any]) -> int:
    """Store the routers' last-use times (``GET /admin/keys/usage``). Returns keys updated."""
    updated = 0
    for key_id, counts in (usage.get("keys") or {}).items():
        last_used = counts.get("last_used") if isinstance(counts, dict) else None
        if not str(key_id).isdigit() or not isinstance(last_used, (int, float)):
            continue
        when = datetime.fromtimestamp(last_used, tz=timezone.get_current_timezone())
        # Only forward in time: several routers (and replicas) report the same key.
        updated += ApiKey.objects.filter(pk=int(key_id)).exclude(last_used_at__gte=when).update(
            last_used_at=when)
    return updated
