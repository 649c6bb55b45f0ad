"""Websocket consumers: they check who is asking, subscribe to one group, and forward. They check
again whenever the reader's access changes (access.py) and before a send once their last check
is ``RECHECK_EVERY_S`` old, and close with ``CLOSE_ACCESS_ENDED`` when the reader may no longer
see what they stream."""

from __future__ import annotations

import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model

from console.accounts.roles import User, visible
from console.deployments.models import Deployment
from console.live.groups import deployment_group, process_group, user_group
from console.live.hub import ensure_hub
from console.supervisor.models import ManagedProcess
from console.supervisor.visibility import visible_processes

# Application close codes (4000-4999): the browser shows why it was refused.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_ACCESS_ENDED = 4403
CLOSE_NOT_FOUND = 4404
# The longest a socket goes on sending on an access check it made earlier. A membership change
# made through the console reaches its sockets at once; this bounds one that did not (made in
# a shell, or in another process with the in-memory channel layer).
RECHECK_EVERY_S = 10.0


def current_user(user: User) -> User | None:
    """The user as stored now (roles read afresh), or None once deleted or deactivated. Call it
    off the event loop."""
    if not user.is_authenticated:
        return None
    return get_user_model().objects.filter(pk=user.pk, is_active=True).first()


class AccessCheckedConsumer(AsyncJsonWebsocketConsumer):
    """A consumer whose reader's access is checked again: on an ``access.changed`` message to
    the reader's ``user-<id>`` group, and before a send once the last check is old."""

    checked_at: float = 0.0
    access_group: str = ""

    async def join_access_group(self, user: User) -> None:
        self.access_group = user_group(user.pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)
        self.checked_at = time.monotonic()

    async def leave_access_group(self) -> None:
        if self.access_group:
            await self.channel_layer.group_discard(self.access_group, self.channel_name)
            self.access_group = ""

    async def recheck(self) -> bool:
        """Whether the reader may still see what this socket streams (False: the socket is
        closed)."""
        self.checked_at = time.monotonic()
        if await self.still_allowed():
            return True
        await self.leave_access_group()
        await self.close(code=CLOSE_ACCESS_ENDED)
        return False

    async def still_allowed(self) -> bool:
        raise NotImplementedError

    async def access_changed(self, event: dict[str, Any]) -> None:
        await self.recheck()

    async def forward(self, event: dict[str, Any]) -> None:
        # Per message (log lines, metric snapshots): a clock read, a query only every
        # RECHECK_EVERY_S.
        if not self.access_group:
            return  # closed on a re-check; messages already queued are dropped
        if time.monotonic() - self.checked_at >= RECHECK_EVERY_S and not await self.recheck():
            return
        await self.send_json(event["payload"])


class _GroupConsumer(AccessCheckedConsumer):
    group: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        group = await self.resolve_group(self.scope["url_route"]["kwargs"], user)
        if group is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = group
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.join_access_group(user)
        await self.accept()
        ensure_hub()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        await self.leave_access_group()

    async def still_allowed(self) -> bool:
        user = await database_sync_to_async(current_user)(self.scope["user"])
        if user is None:
            return False
        return await self.resolve_group(self.scope["url_route"]["kwargs"], user) == self.group

    async def resolve_group(self, kwargs: dict[str, Any], user: User) -> str | None:
        """The group to join, or None when there is nothing the user may see (the same close
        whether it does not exist or is another team's)."""
        raise NotImplementedError


class ProcessLogConsumer(_GroupConsumer):
    """``/ws/processes/<id>/logs/``: new log lines of one process."""

    async def resolve_group(self, kwargs: dict[str, Any], user: User) -> str | None:
        def exists() -> bool:
            # Reading the user's teams is a query too: all of it off the event loop.
            rows = ManagedProcess.objects.filter(pk=kwargs["process_id"])
            return visible_processes(rows, user).exists()

        seen = await database_sync_to_async(exists)()
        return process_group(kwargs["process_id"]) if seen else None


class DeploymentLiveConsumer(_GroupConsumer):
    """``/ws/deployments/<id>/live/``: the deployment's metric snapshots, once a second."""

    async def resolve_group(self, kwargs: dict[str, Any], user: User) -> str | None:
        def exists() -> bool:
            return visible(Deployment.objects.filter(pk=kwargs["deployment_id"]), user).exists()

        seen = await database_sync_to_async(exists)()
        return deployment_group(kwargs["deployment_id"]) if seen else None
