"""Websocket consumers: they check who is asking, subscribe to one group, and forward."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.deployments.models import Deployment
from console.live.groups import deployment_group, process_group
from console.live.hub import ensure_hub
from console.supervisor.models import ManagedProcess

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
        group = await self.resolve_group(self.scope["url_route"]["kwargs"])
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

    async def resolve_group(self, kwargs: dict[str, Any]) -> str | None:
        raise NotImplementedError


class ProcessLogConsumer(_GroupConsumer):
    """``/ws/processes/<id>/logs/``: new log lines of one process."""

    async def resolve_group(self, kwargs: dict[str, Any]) -> str | None:
        exists = await database_sync_to_async(
            ManagedProcess.objects.filter(pk=kwargs["process_id"]).exists
        )()
        return process_group(kwargs["process_id"]) if exists else None


class DeploymentLiveConsumer(_GroupConsumer):
    """``/ws/deployments/<id>/live/``: the deployment's metric snapshots, once a second."""

    async def resolve_group(self, kwargs: dict[str, Any]) -> str | None:
        exists = await database_sync_to_async(
            Deployment.objects.filter(pk=kwargs["deployment_id"]).exists
        )()
        return deployment_group(kwargs["deployment_id"]) if exists else None
