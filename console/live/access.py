"""Open websockets follow their reader's access: when a membership is added, changed or removed,
or a user is deactivated or loses the superuser, every socket of that user re-checks what it
streams (consumers.py) and closes when its reader may no longer see it.

A message to ``user-<id>`` reaches the sockets in every console process on Redis; with the
in-memory layer only those of the process that made the change. Consumers also re-check before
a send when their last check is older than ``RECHECK_EVERY_S``, which bounds what a change made
elsewhere (a shell, another process without Redis) can leak.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from console.accounts.models import Membership
from console.live.groups import user_group

ACCESS_CHANGED = "access.changed"
# The user fields whose change can end what a socket may stream.
USER_ACCESS_FIELDS = frozenset({"is_active", "is_superuser"})


def access_changed(user_id: int) -> None:
    """Tell the user's open sockets to re-check, once the change is committed."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(user_group(user_id), {"type": ACCESS_CHANGED})

    transaction.on_commit(send)


def _membership_changed(sender: type[Membership], instance: Membership, **kwargs: Any) -> None:
    access_changed(instance.user_id)


def _user_saved(sender: type, instance: Any, update_fields: frozenset[str] | None = None,
                created: bool = False, **kwargs: Any) -> None:
    # A login saves last_login alone: no socket needs to hear of it.
    if created or (update_fields is not None and not USER_ACCESS_FIELDS & set(update_fields)):
        return
    access_changed(instance.pk)


def connect_signals() -> None:
    post_save.connect(_membership_changed, sender=Membership, dispatch_uid="live-member-saved")
    post_delete.connect(_membership_changed, sender=Membership,
                        dispatch_uid="live-member-deleted")
    post_save.connect(_user_saved, sender=get_user_model(), dispatch_uid="live-user-saved")
