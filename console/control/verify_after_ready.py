"""The verification after a start or a promotion (console/verification): each waiting report
is sent once its deployment's process table says ready, so the report measures the workers the
start or the promotion brought, not their start-up."""

from __future__ import annotations

from console.control.status import overall_state
from console.supervisor.models import ManagedProcess
from console.verification import services
from console.verification.models import VerificationReport


def step() -> bool:
    """Send the waiting reports whose deployment is ready; True when one moved."""
    moved = False
    waiting = VerificationReport.objects.filter(
        state=VerificationReport.State.WAITING).select_related("deployment")
    for report in waiting:
        processes = list(ManagedProcess.objects.filter(deployment=report.deployment))
        ready = overall_state(report.deployment, processes) == "ready"
        moved = services.send_when_ready(report, ready) or moved
    return moved
