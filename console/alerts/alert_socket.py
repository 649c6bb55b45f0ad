"""``/ws/alerts/``: alert changes of every team the reader belongs to, for the alert dashboard
and the navigation bar's count. The teams follow the reader's memberships while the socket is
open (console/live/access.py); a deactivated reader's socket closes."""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.urls import path

from console.accounts.roles import User, visible_teams
from console.alerts.streams import team_group
from console.live.consumers import CLOSE_UNAUTHENTICATED, AccessCheckedConsumer, current_user
from console.live.hub import ensure_hub


def _team_groups(user: User) -> set[str]:
    return {team_group(pk) for pk in visible_teams(user).values_list("pk", flat=True)}


class AlertsConsumer(AccessCheckedConsumer):
    groups_joined: set[str]

    async def connect(self) -> None:
        self.groups_joined = set()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self._join(await database_sync_to_async(_team_groups)(user))
        await self.join_access_group(user)
        await self.accept()
        ensure_hub()

    async def _join(self, groups: set[str]) -> None:
        for group in sorted(groups - self.groups_joined):
            await self.channel_layer.group_add(group, self.channel_name)
        for group in sorted(self.groups_joined - groups):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = set(groups)

    async def still_allowed(self) -> bool:
        """The teams' groups follow the memberships as stored now; False once the reader is
        deactivated or deleted."""

        def groups() -> set[str] | None:
            user = current_user(self.scope["user"])
            return None if user is None else _team_groups(user)

        now = await database_sync_to_async(groups)()
        await self._join(now or set())
        return now is not None

    async def disconnect(self, code: int) -> None:
        await self._join(set())
        await self.leave_access_group()


websocket_urlpatterns = [path("ws/alerts/", AlertsConsumer.as_asgi())]
