"""Writing audit entries: ``record`` one per change, with a field diff whose secrets are
masked."""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models

from console.audit.actors import current_actor
from console.audit.models import AuditEntry

MASK = "********"
# Fields whose values never reach the log, only the fact that they changed.
SECRET_WORDS = ("secret", "password", "token", "hash", "api_key")


def is_secret(field: str) -> bool:
    name = field.lower()
    return any(word in name for word in SECRET_WORDS)


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Iterable):
        return [_plain(v) for v in value]
    return str(value)


def snapshot(instance: models.Model, fields: Iterable[str] | None = None,
             exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The instance's concrete and many-to-many fields as plain values (m2m as sorted ids)."""
    skip = set(exclude)
    wanted = set(fields) if fields is not None else None
    values: dict[str, Any] = {}
    opts = instance._meta
    for field in [*opts.concrete_fields, *opts.many_to_many]:
        if field.name in skip or (wanted is not None and field.name not in wanted):
            continue
        if field.many_to_many:
            values[field.name] = (sorted(o.pk for o in getattr(instance, field.name).all())
                                  if instance.pk is not None else [])
        else:
            values[field.name] = _plain(getattr(instance, field.attname))
    return values


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
    """{field: [before, after]} for every field that differs, secrets masked."""
    changes: dict[str, list[Any]] = {}
    for field in sorted(set(before) | set(after)):
        old, new = _plain(before.get(field)), _plain(after.get(field))
        if old == new:
            continue
        if is_secret(field):
            old, new = (MASK if old else old), (MASK if new else new)
        changes[field] = [old, new]
    return changes


def record(action: str, obj: models.Model | None = None, *,
           before: Mapping[str, Any] | None = None, after: Mapping[str, Any] | None = None,
           object_type: str = "", object_id: object = "", object_repr: str = "",
           team_id: int | None = None) -> AuditEntry:
    """Write the entry for one change, made by whoever ``current_actor`` says is acting.

    ``action`` is ``<object>.<verb>`` (``deployment.start``); ``obj`` names the object unless
    ``object_type``/``object_id``/``object_repr`` do (for objects already deleted)."""
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or obj.pk
        object_repr = object_repr or str(obj)
        if team_id is None:
            team_id = getattr(obj, "team_id", None)
    if not object_type:
        raise ValueError(f"record({action!r}): name the object (obj or object_type)")
    actor = current_actor()
    user = actor.user
    return AuditEntry.objects.create(
        actor=actor.kind, user=user, username=user.get_username() if user is not None else "",
        via=actor.via, address=actor.address, action=action, object_type=object_type,
        object_id=str(object_id or ""), object_repr=object_repr[:200], team_id=team_id,
        changes=diff(before or {}, after or {}))


def delete_recorded(action: str, obj: models.Model, before: Mapping[str, Any]) -> AuditEntry:
    """Delete ``obj`` and write its entry, naming it as it was (its id is gone afterwards)."""
    object_type, object_id, object_repr = obj._meta.label_lower, obj.pk, str(obj)
    team_id = getattr(obj, "team_id", None)
    obj.delete()
    return record(action, object_type=object_type, object_id=object_id,
                  object_repr=object_repr, team_id=team_id, before=before)
