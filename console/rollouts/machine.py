"""The rollout's stored state machine: every change of state is one row of its history and one
audit entry, written in the same transaction as the state itself."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.actors import current_actor
from console.audit.entries import record
from console.live.broadcast import send_all
from console.rollouts.models import AnalysisRun, Rollout, RolloutTransition
from console.rollouts.rollout_socket import rollout_messages

State = Rollout.State
SUPERVISOR = "supervisor"

# Which states each state may go to; anything else is a bug, refused loudly.
ALLOWED: dict[str, frozenset[str]] = {
    State.RELEASING: frozenset({State.STARTING, State.PAUSED, State.ROLLING_BACK}),
    # To stepping straight away when the revision's gate is off.
    State.STARTING: frozenset({State.GATING, State.STEPPING, State.PAUSED, State.ROLLING_BACK}),
    State.GATING: frozenset({State.STEPPING, State.PAUSED, State.ROLLING_BACK}),
    # In place, a step ends by releasing blue's next pair, or (the last) by draining blue.
    State.STEPPING: frozenset({State.STEPPING, State.RELEASING, State.WARM, State.DRAINING,
                               State.PAUSED, State.ROLLING_BACK}),
    State.PAUSED: frozenset({State.RELEASING, State.STARTING, State.GATING, State.STEPPING,
                             State.WARM, State.ROLLING_BACK}),
    State.WARM: frozenset({State.DRAINING, State.PAUSED, State.ROLLING_BACK}),
    State.DRAINING: frozenset({State.SUCCEEDED}),
    State.ROLLING_BACK: frozenset({State.ROLLED_BACK}),
    State.SUCCEEDED: frozenset(),
    State.ROLLED_BACK: frozenset(),
}


class TransitionRefused(Exception):
    """The rollout is not in a state that allows this; the message says which it is in."""


def actor_name() -> str:
    actor = current_actor()
    if actor.user is not None:
        return actor.user.get_username()
    return actor.via or actor.kind


def move(rollout: Rollout, to: str, reason: str, **changes: Any) -> Rollout:
    """Store ``to`` (and ``changes`` of other fields) with its history row and audit entry.
    The row is locked and read again first, so two movers (the supervisor's tick and a user's
    click) never both act on one state."""
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if to != locked.state and to not in ALLOWED[locked.state]:
            raise TransitionRefused(f"the rollout is {locked.state}: it cannot go to {to}")
        now = timezone.now()
        before = locked.state
        for name, value in changes.items():
            setattr(locked, name, value)
        locked.state = to
        locked.reason = reason[:1000]
        locked.state_since = now
        if to in Rollout.DONE_STATES:
            locked.finished = now
        locked.save()
        row = RolloutTransition.objects.create(rollout=locked, from_state=before, to_state=to,
                                         actor=actor_name(), reason=reason[:1000],
                                         weights=locked.weights)
        record(f"rollout.{to}", locked, team_id=locked.deployment.team_id,
               before={"state": before}, after={
                   "state": to, "reason": reason[:1000], "weights": locked.weights,
                   "step": locked.step_index, "deployment": locked.deployment.name})
        transaction.on_commit(lambda: broadcast(transitions=[row]))
    rollout.refresh_from_db()
    return rollout


def broadcast(transitions: list[RolloutTransition] | None = None,
              analyses: list[AnalysisRun] | None = None,
              rollouts: list[Rollout] | None = None) -> None:
    """With a shared channel layer, send the new rows (and the ``rollouts`` whose progress
    changed) to the rollout's page at once; without Redis the console's hub polls them
    (console/rollouts/rollout_socket.py)."""
    if settings.REDIS_URL:
        async_to_sync(send_all)(rollout_messages(transitions or (), analyses or (),
                                                 rollouts or ()))
