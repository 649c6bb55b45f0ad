"""``/ws/alerts/``: alert changes of every team the reader belongs to, for the alert dashboard
and the navigation bar's count."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.urls import path

from console.accounts.roles import visible_teams
from console.alerts.streams import team_group
from console.live.consumers import CLOSE_UNAUTHENTICATED
from console.live.hub import ensure_hub


class AlertsConsumer(AsyncJsonWebsocketConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        team_ids = await database_sync_to_async(
            lambda: list(visible_teams(user).values_list("pk", flat=True)))()
        for team_id in team_ids:
            group = team_group(team_id)
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()
        ensure_hub()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def forward(self, event: dict[str, Any]) -> None:
        await self.send_json(event["payload"])


websocket_urlpatterns = [path("ws/alerts/", AlertsConsumer.as_asgi())]
