"""Following a change after the autoscaler made it: when each added worker became ready and
joined the router (or was withdrawn before it did), when each removed one left the router's
pools and its process stopped. The times go into the decision's ``progress``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from console.autoscaling.models import ScalingDecision
from console.deployments.models import Deployment
from console.gateway.router_admin import AdminUnreadable, pool_members, router_running
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.autoscaler")

# A change's progress is followed this long at most.
FOLLOW_S = 1800.0


def follow(now: datetime) -> list[ScalingDecision]:
    """Bring the open changes' progress up to date; returns the decisions it moved."""
    since = datetime.fromtimestamp(now.timestamp() - FOLLOW_S, tz=UTC)
    open_changes = ScalingDecision.objects.filter(
        at__gte=since, dry_run=False, action__in=["up", "down"]).exclude(
        progress__has_key="done_at").select_related("deployment")
    # Per deployment, read once this tick: its router's members and its planned slots.
    seen: dict[int, tuple[set[str] | None, set[str]]] = {}
    moved: list[ScalingDecision] = []
    for decision in open_changes:
        progress = dict(decision.progress)
        if decision.deployment_id not in seen:
            seen[decision.deployment_id] = (
                _members(decision.deployment),
                {w.slot for w in decision.deployment.workers.all()})
        members, planned = seen[decision.deployment_id]
        done = True
        for entry in decision.slots:
            if decision.action == "up":
                done = _follow_added(decision, entry, planned, members, progress, now) and done
            else:
                done = _follow_removed(decision, entry, members, progress, now) and done
        if done:
            progress["done_at"] = now.isoformat()
        if progress != decision.progress:
            decision.progress = progress
            decision.save(update_fields=["progress", "changed"])
            moved.append(decision)
    return moved


def _follow_added(decision: ScalingDecision, entry: dict[str, str], planned: set[str],
                  members: set[str] | None, progress: dict[str, str], now: datetime) -> bool:
    """Ready, then joined; or withdrawn: a later decision took it out of the plan before it
    joined (a slot added again after that is another decision's)."""
    slot, url = entry["slot"], entry["url"]
    key = slot.replace("-", "_")
    if f"{key}_joined_at" in progress or f"{key}_withdrawn_at" in progress:
        return True
    if slot not in planned:
        progress[f"{key}_withdrawn_at"] = now.isoformat()
        return True
    process = ManagedProcess.objects.filter(deployment=decision.deployment, slot=slot).first()
    if (process is not None and process.ready_at and process.ready_at >= decision.at
            and f"{key}_ready_at" not in progress):
        progress[f"{key}_ready_at"] = process.ready_at.isoformat()
    if members is not None and url in members and f"{key}_ready_at" in progress:
        progress[f"{key}_joined_at"] = now.isoformat()
        return True
    return False

def _follow_removed(decision: ScalingDecision, entry: dict[str, str],
                    members: set[str] | None, progress: dict[str, str],
                    now: datetime) -> bool:
    """Out of the router's pools (drained), then its process stopped."""
    slot, url = entry["slot"], entry["url"]
    key = slot.replace("-", "_")
    if members is not None and url not in members and f"{key}_left_at" not in progress:
        progress[f"{key}_left_at"] = now.isoformat()
    gone = not ManagedProcess.objects.filter(
        deployment=decision.deployment, slot=slot,
        state__in=[ManagedProcess.State.READY, ManagedProcess.State.STARTING,
                   ManagedProcess.State.STOPPING]).exists()
    if gone and f"{key}_stopped_at" not in progress:
        progress[f"{key}_stopped_at"] = now.isoformat()
    return f"{key}_stopped_at" in progress

def _members(deployment: Deployment) -> set[str] | None:
    """The urls in the router's pools that take requests (None: unknown now)."""
    if not router_running(deployment):
        return None
    try:
        return {m.url for m in pool_members(deployment, timeout_s=2.0)
                if m.state != "draining"}
    except AdminUnreadable as exc:
        log.info("%s: the router's pools are unreadable now (%s)", deployment.name, exc)
        return None

