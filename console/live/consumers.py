"""Websocket consumers: they check who is asking, subscribe to one group, and forward."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.accounts.roles import User, visible
from console.deployments.models import Deployment
from console.live.groups import deployment_group, process_group
from console.live.hub import ensure_hub
from console.supervisor.models import ManagedProcess
from console.supervisor.visibility import visible_processes

# Application close codes (4000-4999): the browser shows why it was refused.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class _GroupConsumer(AsyncJsonWebsocketConsumer):
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
        await self.accept()
        ensure_hub()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def forward(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])

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
