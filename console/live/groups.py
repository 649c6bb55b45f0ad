"""Channel group names and the one function that sends to them.

Rule for group names: ``<kind>-<id>``: ``process-<ManagedProcess.id>`` carries log lines,
``deployment-<Deployment.id>`` carries metric snapshots, ``user-<User.id>`` tells a user's
open sockets that their access changed (access.py).
"""

from __future__ import annotations

from typing import Any

from channels.layers import get_channel_layer


def process_group(process_id: int) -> str:
    return f"process-{process_id}"


def deployment_group(deployment_id: int) -> str:
    return f"deployment-{deployment_id}"


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


async def emit(group: str, payload: dict[str, Any]) -> None:
    """Send ``payload`` to every socket in ``group``; consumers forward it unchanged."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(group, {"type": "forward", "payload": payload})
