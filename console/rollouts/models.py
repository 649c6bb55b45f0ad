"""Revisions of a deployment and the rollouts between them.

A revision is an immutable snapshot of everything that changes what the workers compute or how
they are laid out (console/rollouts/revisions.py lists the fields). A rollout moves traffic from
the live revision ("blue") to another ("green") through the router's revision groups; every
state it passes through is a stored :class:`RolloutTransition`, so that a restarted supervisor
goes on from the stored state (console/control/rollout_runner.py drives it).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Revision(models.Model):
    class State(models.TextChoices):
        DRAFT = "draft"          # made, never live yet
        LIVE = "live"            # the workers the plan runs
        RETIRED = "retired"      # was live; a rollout replaced it (a rollback can bring it back)
        FAILED = "failed"        # a rollout to it was rolled back

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="revisions")
    number = models.PositiveIntegerField()
    spec = models.JSONField(help_text="the snapshot: mode, pools, engine and gate settings")
    state = models.CharField(max_length=10, choices=State.choices, default=State.DRAFT)
    note = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["deployment", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="revision_unique_number"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment.name} r{self.number}"

    @property
    def label(self) -> str:
        """The router's name for the revision's group."""
        return str(self.number)


class Rollout(models.Model):
    class Strategy(models.TextChoices):
        BLUE_GREEN = "blue_green", "blue-green (green beside blue, one switch)"
        CANARY = "canary", "canary (weights in steps, analysis before each increase)"
        IN_PLACE = "in_place", "in place (one prefill+decode pair at a time)"

    class State(models.TextChoices):
        RELEASING = "releasing"      # in place: blue's next pair drains and stops for green's
        STARTING = "starting"        # green's workers start beside blue's
        GATING = "gating"            # the output gate runs on green, before any traffic
        STEPPING = "stepping"        # green holds the current step's weight; analysis runs
        PAUSED = "paused"            # an operator paused it; weights stay
        WARM = "warm"                # green has all traffic; blue stays warm for the delay
        DRAINING = "draining"        # blue takes no new requests and finishes its own
        ROLLING_BACK = "rolling_back"  # green's weight is 0; green drains, then stops
        SUCCEEDED = "succeeded"
        ROLLED_BACK = "rolled_back"

    ACTIVE_STATES = (State.RELEASING, State.STARTING, State.GATING, State.STEPPING, State.PAUSED, State.WARM,
                     State.DRAINING, State.ROLLING_BACK)
    DONE_STATES = (State.SUCCEEDED, State.ROLLED_BACK)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="rollouts")
    # RESTRICT: a revision a rollout names is deleted only with its deployment.
    from_revision = models.ForeignKey(Revision, on_delete=models.RESTRICT, related_name="+")
    to_revision = models.ForeignKey(Revision, on_delete=models.RESTRICT, related_name="rollouts")
    strategy = models.CharField(max_length=12, choices=Strategy.choices)
    state = models.CharField(max_length=14, choices=State.choices, default=State.STARTING)
    # The state a pause interrupted, which Resume returns to.
    paused_from = models.CharField(max_length=14, blank=True)
    # [{"weight": 10, "hold_s": 60}, ...]: green's share of the traffic at each step, in %.
    steps = models.JSONField()
    step_index = models.PositiveSmallIntegerField(default=0)
    # revision label -> weight, as last sent to the router (resent after a router restart).
    weights = models.JSONField(default=dict)
    # {"interval_s", "failure_limit", "min_requests", "metrics": {name: {"max", "max_ratio"}}}
    analysis = models.JSONField()
    failures = models.PositiveSmallIntegerField(default=0, help_text="failed analysis windows")
    scale_down_delay_s = models.PositiveIntegerField(default=30)
    drain_timeout_s = models.PositiveIntegerField(default=120)
    # Green's start fails after this long without progress (no log line, no phase change) of a
    # worker, counted from its last progress, not from the start (console/rollouts/green_progress.py).
    start_timeout_s = models.PositiveIntegerField(default=600)
    # Green's workers while they start: slot -> {"phase", "phase_since", "progress_at", ...}
    # (green_progress.follow), and the analysis window being collected: {"opened", "requests"}.
    progress = models.JSONField(default=dict, blank=True)
    # Green's workers: slot -> {"port", "side_channel_port"}, chosen when the rollout is made
    # (in place: blue's own, freed pair by pair).
    green_ports = models.JSONField(default=dict)
    # In place: which pairs (by index) green's workers hold now ("green"), and the pair between
    # the two ("transit": neither runs it; the one leaving drains and stops first).
    units = models.JSONField(default=dict, blank=True)
    # The output gate on green: {"state", "report", "error"} once it ran.
    gate = models.JSONField(default=dict, blank=True)
    # Green verified alone before blue stops: the report the rollout asked (warm waits for it
    # to pass; one that does not pass rolls back). A promote does not skip it.
    verify_green = models.BooleanField(
        default=False, help_text="a passing verification report of green alone, with all the "
        "traffic, before blue is drained (a failing one rolls back)")
    verification = models.ForeignKey("verification.VerificationReport", null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    reason = models.CharField(max_length=1000, blank=True, help_text="why the last transition")
    state_since = models.DateTimeField()
    # When green took the current step's weight (the hold counts from here).
    step_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return (f"{self.deployment.name} r{self.from_revision.number} -> "
                f"r{self.to_revision.number} ({self.state})")

    @property
    def active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def blue(self) -> Revision:
        return self.from_revision

    @property
    def green(self) -> Revision:
        return self.to_revision


class RolloutTransition(models.Model):
    """One change of a rollout's state: who, when, from, to and why."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="transitions")
    at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=14, blank=True)
    to_state = models.CharField(max_length=14)
    actor = models.CharField(max_length=150, help_text="a user's name, or 'supervisor'")
    reason = models.CharField(max_length=1000)
    weights = models.JSONField(default=dict)

    class Meta:
        ordering = ["at", "pk"]


class AnalysisRun(models.Model):
    """Green beside blue over one window of the router's metrics."""

    class Verdict(models.TextChoices):
        PASS = "pass"
        FAIL = "fail"
        # Too few requests on one side when the window's bound ran out (a window grows until
        # both sides have their minimum): the rollout pauses for a person; never a pass.
        INCONCLUSIVE = "inconclusive"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="analyses")
    step_index = models.PositiveSmallIntegerField()
    at = models.DateTimeField(auto_now_add=True)
    window_s = models.FloatField()
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    # {metric: {"blue": v, "green": v, "limit": v, "verdict": ..., "why": ...}}
    metrics = models.JSONField(default=dict)
    requests = models.JSONField(default=dict, help_text="revision label -> requests in the window")

    class Meta:
        ordering = ["at", "pk"]
