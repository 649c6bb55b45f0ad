"""The analysis windows of a rollout's steps (console/control/rollout_runner.py's stepping and
warm states): every interval the router's per-revision metrics are compared since the window
opened (console/rollouts/analysis.py); a window short of requests grows until both sides have
their minimum, and past ``max_inconclusive_s`` it is stored inconclusive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from console.rollouts import analysis
from console.rollouts.machine import broadcast
from console.rollouts.models import AnalysisRun, Rollout
from console.rollouts.services import DEFAULT_MAX_INCONCLUSIVE_S


@dataclass
class Window:
    """An analysis window being collected: it opened at ``opened`` (monotonic) with ``scrape``;
    ``checked``: when its requests were last counted (every interval while it grows)."""

    opened: float
    scrape: analysis.Scrape
    opened_at: datetime
    checked: float


class AnalysisWindows:
    # The runner's: rollout id -> the window being collected, and the monotonic clock.
    windows: dict[int, Window]
    clock: Callable[[], float]

    def _analyse(self, rollout: Rollout) -> str | None:
        """Look at the current window every interval: once both sides have their minimum of
        requests (or its bound ran out), store its verdict and return it; None while it is
        collecting (or just opened). A window short of requests grows instead of holding the
        step forever on 10 s windows; past ``max_inconclusive_s`` it is stored inconclusive
        (the caller pauses the rollout)."""
        now = self.clock()
        opened = self.windows.get(rollout.pk)
        if opened is not None and now - opened.checked < rollout.analysis["interval_s"]:
            return None
        if not self._router_ready(rollout.deployment):
            # No router, no traffic to judge (the supervisor restarts it); the window starts
            # again with the router's new counters.
            self.windows.pop(rollout.pk, None)
            return None
        scrape = self._scrape(rollout.deployment)
        if opened is None:
            self.windows[rollout.pk] = Window(now, scrape, timezone.now(), now)
            self._store_progress(rollout, window={"opened": timezone.now().isoformat(),
                                                  "requests": {}})
            return None
        judgement = analysis.judge(opened.scrape, scrape, rollout.blue.label,
                                   rollout.green.label, rollout.analysis,
                                   baseline=self._baseline(rollout),
                                   blue_serves=rollout.weights.get(rollout.blue.label, 0) > 0)
        bound = rollout.analysis.get("max_inconclusive_s", DEFAULT_MAX_INCONCLUSIVE_S)
        if judgement.verdict == analysis.INCONCLUSIVE and now - opened.opened < bound:
            opened.checked = now
            self._store_progress(rollout, window={"opened": opened.opened_at.isoformat(),
                                                  "requests": judgement.requests})
            return None
        self.windows[rollout.pk] = Window(now, scrape, timezone.now(), now)
        run = AnalysisRun.objects.create(rollout=rollout, step_index=rollout.step_index,
                                         window_s=now - opened.opened, verdict=judgement.verdict,
                                         metrics=judgement.metrics, requests=judgement.requests)
        broadcast(analyses=[run])
        if judgement.verdict == analysis.FAIL:
            Rollout.objects.filter(pk=rollout.pk).update(failures=rollout.failures + 1)
            rollout.failures += 1
        return judgement.verdict

    @staticmethod
    def _last_verdict(rollout: Rollout) -> str | None:
        last = rollout.analyses.filter(step_index=rollout.step_index,
                                       at__gte=rollout.step_since).order_by("-at", "-pk").first()
        return last.verdict if last else None

    @staticmethod
    def _baseline(rollout: Rollout) -> dict[str, float | None] | None:
        """Blue's measures from the last window in which it had enough requests, for windows
        where it has none (green at 100%)."""
        blue = rollout.blue.label
        for run in rollout.analyses.order_by("-at", "-pk")[:50]:
            if run.requests.get(blue, 0) >= rollout.analysis["min_requests"]:
                values = {name: row.get("blue") for name, row in run.metrics.items()}
                return {**values, "requests": run.requests[blue]}
        return None
