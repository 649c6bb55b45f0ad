"""Green's own verification report before blue is drained (console/control/rollout_runner.py's
warm state, for a rollout started with ``verify_green``): asked once green has every request
and blue is still warm, so that its sweep and stress measure green alone and a failure costs no
downtime; one that does not pass rolls back."""

from __future__ import annotations

import logging

from console.rollouts.machine import move
from console.rollouts.models import Rollout
from console.verification import services as verification
from console.verification.models import VerificationReport

log = logging.getLogger("pdserve.rollouts")
State = Rollout.State
# Where green's report stands: passed, waited for, or the rollout moved (the report asked for
# now, or a rollback because it did not pass).
PASSED, WAITING, MOVED = "passed", "waiting", "moved"


def _seen(report: VerificationReport) -> dict[str, object]:
    """Green's report as the rollout's page shows it (in its progress, which the page follows)."""
    return {"report": report.pk, "state": report.state, "verdict": report.verdict}


def _green_options(rollout: Rollout) -> dict[str, object]:
    """The default sweep, and green's NIXL side channels (base slot -> port, chosen with its
    ports when the rollout was made): not in the plan before the promotion, so the report
    learns them from here."""
    options: dict[str, object] = verification.options()
    if rollout.green.spec.get("kv_channel") == "nixl":
        options["green_side_channels"] = {
            slot: ports["side_channel_port"] for slot, ports in rollout.green_ports.items()
            if ports.get("side_channel_port")}
    return options


class GreenVerification:
    """The runner's part for green's report; ``_store_progress``, ``_rollback_weights`` and
    ``_sync_router`` are the runner's own."""

    def _green_verified(self, rollout: Rollout) -> str:
        report = rollout.verification
        if report is None:
            try:
                report = verification.queue_verification(
                    rollout.deployment, VerificationReport.Trigger.GREEN,
                    revision=rollout.green.number, run_options=_green_options(rollout))
            except verification.VerificationRefused:  # another report runs: asked again
                return WAITING
            Rollout.objects.filter(pk=rollout.pk).update(verification=report)
            self._store_progress(rollout, verification=_seen(report))
            log.info("rollout #%d: green r%d's verification #%d queued", rollout.pk,
                     rollout.green.number, report.pk)
            return MOVED
        if rollout.progress.get("verification") != _seen(report):
            self._store_progress(rollout, verification=_seen(report))
        if not report.done:
            return WAITING
        if report.passing:
            return PASSED
        failing = ", ".join(s["name"] for s in report.sections if s.get("verdict") == "fail")
        why = report.error or f"failing sections: {failing}"
        move(rollout, State.ROLLING_BACK, f"green r{rollout.green.number}'s verification "
             f"#{report.pk} did not pass ({why})"[:1000],
             weights=self._rollback_weights(rollout))
        self._sync_router(Rollout.objects.get(pk=rollout.pk))
        return MOVED
