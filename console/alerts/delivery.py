"""Notifications: which notifier hears of which alert, Alertmanager's payload, and sending it.

The evaluator's tick calls ``enqueue``, which only writes ``Delivery`` rows; ``DeliveryWorker``
sends them from threads of its own, so a receiver that fails or hangs never delays a tick.

Alertmanager's behaviour, without its routing tree: a team's enabled notifiers hear of the
alerts of its deployments at or above their ``min_severity``; alerts are grouped by
``alertname`` and ``deployment`` into one notification per group and status; a muted (silenced
or inhibited) alert is not notified, nor is its resolution unless the notifier asks for it
(``send_resolved_when_silenced``: issue 14's "resolved notices are lost for silenced alerts").
A delivery is retried with exponential backoff until it is sent or ``max_attempts`` ran out;
each attempt is a ``DeliveryAttempt`` row.

Teams share the worker's senders fairly (``DeliveryWorker``): one team's slow receivers hold
at most a few of them, never another team's alerts.

Several console processes may each run a worker: a worker claims a delivery by moving its
``next_attempt_at`` past the send's timeout in one conditional UPDATE, so no other worker picks
it meanwhile, and a worker that died mid-send leaves it to be retried once the claim lapses.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Min
from django.utils import timezone

from console.alerts.models import Alert, AlertState, Delivery, DeliveryAttempt, Notifier, Severity
from console.alerts.notifiers import SendResult, sender_for
from console.deployments.models import Deployment

log = logging.getLogger("pdserve.alerts")

PAYLOAD_VERSION = "4"
GROUP_BY = ("alertname", "deployment")
STATUSES = ("firing", "resolved")
# Go's zero time, which Alertmanager sends as the endsAt of an alert still firing.
ZERO_TIME = "0001-01-01T00:00:00Z"
SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
# Up to 10 % more, so that deliveries that failed together (one receiver down) spread out.
BACKOFF_JITTER = 0.1
# A claim outlasts the send: the webhook is bounded by timeout_s as a whole, but the SMTP
# backend applies it to each of a conversation's few operations.
CLAIM_TIMEOUTS = 4
CLAIM_MARGIN_S = 30.0
ERROR_MAX = 1000  # DeliveryAttempt.error's length


@dataclass(frozen=True)
class Notice:
    """An alert the evaluator wants notified: it fired (or went NoData), or it resolved."""

    alert: Alert
    status: str  # "firing" | "resolved"
    muted: bool  # a silence or an inhibiting alert matched it


# ---- the payload ------------------------------------------------------------------------------
def rfc3339(value: datetime) -> str:
    """Go's RFC 3339 with nanoseconds as Alertmanager writes it: UTC ``Z``, no trailing zeros."""
    text = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def group_key(group_labels: dict[str, str]) -> str:
    """Alertmanager's groupKey for the root route: ``{}:{alertname="X", deployment="d"}``."""
    pairs = ", ".join(f"{name}={json.dumps(value)}" for name, value in sorted(group_labels.items()))
    return "{}:{" + pairs + "}"


def alertmanager_payload(alerts: Sequence[Alert], status: str, receiver: str, external_url: str,
                         group_labels: dict[str, str]) -> dict[str, Any]:
    """Alertmanager's webhook payload, version 4, for one group of alerts of one status."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    if not alerts:
        raise ValueError("a notification needs at least one alert")
    base = external_url.rstrip("/")
    common_labels = dict(alerts[0].labels)
    common_annotations = dict(alerts[0].annotations)
    for alert in alerts[1:]:
        common_labels = {k: v for k, v in common_labels.items() if alert.labels.get(k) == v}
        common_annotations = {k: v for k, v in common_annotations.items()
                              if alert.annotations.get(k) == v}
    return {
        "receiver": receiver,
        "status": status,
        "alerts": [{
            "status": status,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "startsAt": rfc3339(_starts_at(alert)),
            "endsAt": ZERO_TIME if status == "firing" else rfc3339(_ends_at(alert)),
            "generatorURL": f"{base}/alerts/{alert.pk}/",
            "fingerprint": alert.fingerprint,
        } for alert in alerts],
        "groupLabels": dict(group_labels),
        "commonLabels": common_labels,
        "commonAnnotations": common_annotations,
        "externalURL": base,
        "version": PAYLOAD_VERSION,
        "groupKey": group_key(group_labels),
        "truncatedAlerts": 0,
    }


def _starts_at(alert: Alert) -> datetime:
    # A NoData alert never fired in this episode (fired_at is None or an older episode's): it
    # became NoData in the tick that notifies it.
    if alert.state == AlertState.NODATA and alert.evaluated_at is not None:
        return alert.evaluated_at
    start = alert.fired_at or alert.active_since or alert.evaluated_at
    if start is None:
        raise ValueError(f"alert {alert.pk} has never been evaluated: it has no start")
    return start


def _ends_at(alert: Alert) -> datetime:
    if alert.resolved_at is None:
        raise ValueError(f"alert {alert.pk} is notified as resolved but has no resolved_at")
    return alert.resolved_at


# ---- enqueueing -------------------------------------------------------------------------------
def enqueue(notices: Sequence[Notice], now: datetime) -> list[Delivery]:
    """The deliveries the notices call for, stored as pending and due now. Only writes rows:
    it runs in the evaluator's tick."""
    for notice in notices:
        if notice.status not in STATUSES:
            raise ValueError(f"notice status must be one of {', '.join(STATUSES)}, "
                             f"not {notice.status!r}")
    if not notices:
        return []
    team_of = dict(Deployment.objects.filter(pk__in={n.alert.deployment_id for n in notices})
                   .values_list("pk", "team_id"))
    notifiers: dict[int, list[Notifier]] = {}
    for notifier in Notifier.objects.filter(team_id__in=set(team_of.values()), enabled=True
                                            ).order_by("pk"):
        notifiers.setdefault(notifier.team_id, []).append(notifier)

    groups: dict[tuple[int, int, str, str], dict[int, Alert]] = {}
    chosen: dict[int, Notifier] = {}
    for notice in notices:
        alert = notice.alert
        for notifier in notifiers.get(team_of[alert.deployment_id], []):
            if not _wanted(notice, notifier):
                continue
            key = (notifier.pk, alert.deployment_id, alert.labels.get("alertname", ""),
                   notice.status)
            groups.setdefault(key, {})[alert.pk] = alert
            chosen[notifier.pk] = notifier
    if not groups:
        return []

    external_url = settings.PDSERVE_EXTERNAL_URL
    rows: list[Delivery] = []
    members: list[list[Alert]] = []
    for (notifier_id, deployment_id, _name, status), by_pk in groups.items():
        alerts = [by_pk[pk] for pk in sorted(by_pk)]
        group_labels = {name: alerts[0].labels[name] for name in GROUP_BY
                        if alerts[0].labels.get(name)}
        payload = alertmanager_payload(alerts, status, chosen[notifier_id].name, external_url,
                                       group_labels)
        rows.append(Delivery(notifier_id=notifier_id, deployment_id=deployment_id, status=status,
                             payload=payload, state=Delivery.State.PENDING, next_attempt_at=now))
        members.append(alerts)
    through = Delivery.alerts.through
    with transaction.atomic():
        created = Delivery.objects.bulk_create(rows)
        through.objects.bulk_create([through(delivery_id=delivery.pk, alert_id=alert.pk)
                                     for delivery, alerts in zip(created, members, strict=True)
                                     for alert in alerts])
    return created


def _wanted(notice: Notice, notifier: Notifier) -> bool:
    # A severity this console does not define (a label someone set by hand) ranks as info.
    severity = SEVERITY_RANK.get(notice.alert.labels.get("severity", ""), 0)
    if severity < SEVERITY_RANK[notifier.min_severity]:
        return False
    if notice.status == "firing":
        return not notice.muted
    if not notifier.send_resolved:
        return False
    return not notice.muted or notifier.send_resolved_when_silenced


# ---- sending ----------------------------------------------------------------------------------
def backoff_s(failures: int) -> float:
    """The wait after the n-th failed attempt: 1 s, 2 s, 4 s ... at most 60 s, plus jitter."""
    delay = BACKOFF_BASE_S * 2 ** (failures - 1) * (1 + random.uniform(0, BACKOFF_JITTER))
    return min(BACKOFF_MAX_S, delay)


class DeliveryWorker:
    """Sends due deliveries on a small thread pool, from a thread of its own.

    A worker claims no more deliveries than it has free senders, so one hanging receiver holds
    one sender for at most its timeout and the others go on. Teams share the senders: a team
    holds at most ``per_team`` of them at once, and free senders go round-robin to the teams
    with due deliveries, the team that has waited longest first, so a team whose receivers hang
    (or that has a thousand deliveries due) cannot make another team's alerts wait for them. A
    stopped worker does not start again.
    """

    def __init__(self, senders: int = 8, per_team: int = 2, poll_s: float = 1.0) -> None:
        if senders < 1:
            raise ValueError(f"senders must be at least 1, not {senders}")
        if not 1 <= per_team <= senders:
            raise ValueError(f"per_team must be between 1 and senders ({senders}), not {per_team}")
        self.senders = senders
        self.per_team = per_team
        self.poll_s = poll_s
        self._pool = ThreadPoolExecutor(max_workers=senders, thread_name_prefix="alert-sender")
        self._lock = threading.Lock()
        self._in_flight: dict[int, int] = {}  # team id: its deliveries being sent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: datetime) -> int:
        """Claim the deliveries due at ``now``, send them and record the outcomes; how many."""
        futures = self._dispatch(now)
        wait(futures)
        for future in futures:
            future.result()
        return len(futures)

    def start(self) -> None:
        def loop() -> None:
            running: set[Future[None]] = set()
            try:
                while not self._stop.is_set():
                    try:
                        running.update(self._dispatch(timezone.now()))
                    except Exception:  # a locked database must not end notifications
                        log.exception("picking due alert deliveries failed; retrying")
                    for future in [f for f in running if f.done()]:
                        running.discard(future)
                        if future.exception() is not None:
                            log.error("recording an alert delivery attempt failed",
                                      exc_info=future.exception())
                    self._stop.wait(self.poll_s)
            finally:
                connection.close()

        self._thread = threading.Thread(target=loop, name="alert-delivery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._pool.shutdown(wait=True)

    def _dispatch(self, now: datetime) -> list[Future[None]]:
        with self._lock:
            busy = {team: count for team, count in self._in_flight.items() if count}
        free = self.senders - sum(busy.values())
        if free <= 0:
            return []
        futures = []
        for delivery in _claim(now, free, self.per_team, busy):
            team = delivery.notifier.team_id
            with self._lock:
                self._in_flight[team] = self._in_flight.get(team, 0) + 1
            future = self._pool.submit(_attempt, delivery)
            future.add_done_callback(partial(self._finished, team))
            futures.append(future)
        return futures

    def _finished(self, team: int, _future: Future[None]) -> None:
        with self._lock:
            self._in_flight[team] -= 1


def _fair_share(now: datetime, free: int, per_team: int, busy: dict[int, int]) -> list[Delivery]:
    """Up to ``free`` due deliveries, taken round-robin from the teams with room left (fewer
    than ``per_team`` in flight), the team whose oldest delivery has waited longest first, and
    within a team oldest first."""
    due = Delivery.objects.filter(state=Delivery.State.PENDING, next_attempt_at__lte=now)
    full = [team for team, count in busy.items() if count >= per_team]
    # One query for the teams, one for each of at most ``free`` of them.
    teams = list(due.exclude(notifier__team_id__in=full).values("notifier__team_id")
                 .annotate(oldest=Min("next_attempt_at")).order_by("oldest", "notifier__team_id")
                 .values_list("notifier__team_id", flat=True)[:free])
    queues = {team: list(due.filter(notifier__team_id=team).select_related("notifier")
                         .order_by("next_attempt_at", "pk")[:per_team - busy.get(team, 0)])
              for team in teams}
    chosen: list[Delivery] = []
    while len(chosen) < free and any(queues.values()):
        for team in teams:
            if queues[team] and len(chosen) < free:
                chosen.append(queues[team].pop(0))
    return chosen


def _claim(now: datetime, free: int, per_team: int, busy: dict[int, int]) -> list[Delivery]:
    claimed = []
    for delivery in _fair_share(now, free, per_team, busy):
        until = now + timedelta(seconds=CLAIM_TIMEOUTS * delivery.notifier.timeout_s
                                + CLAIM_MARGIN_S)
        # The condition is the claim: of two workers that saw it due, one UPDATE matches.
        if Delivery.objects.filter(pk=delivery.pk, state=Delivery.State.PENDING,
                                   next_attempt_at__lte=now).update(next_attempt_at=until):
            claimed.append(delivery)
    return claimed


def _attempt(delivery: Delivery) -> None:
    notifier = delivery.notifier
    try:
        started = timezone.now()
        clock = time.perf_counter()
        try:
            result = sender_for(notifier.kind).send(delivery.payload, notifier)
        except Exception as exc:
            # A sender's bug: logged with its traceback and recorded as the attempt's outcome,
            # so that the delivery still ends instead of being retried forever unrecorded.
            log.exception("notifier %s crashed sending delivery %s", notifier, delivery.pk)
            result = SendResult(ok=False, error=f"internal error: {type(exc).__name__}: {exc}")
        _record(delivery, result, started, (time.perf_counter() - clock) * 1000)
    finally:
        connections.close_all()


def _record(delivery: Delivery, result: SendResult, started: datetime, duration_ms: float) -> None:
    notifier = delivery.notifier
    attempts = delivery.attempts + 1
    finished = timezone.now()
    fields: dict[str, Any] = {"attempts": attempts}
    if result.ok:
        fields.update(state=Delivery.State.SENT, finished_at=finished)
    elif attempts >= max(1, notifier.max_attempts):
        fields.update(state=Delivery.State.FAILED, finished_at=finished)
    else:
        fields.update(next_attempt_at=finished + timedelta(seconds=backoff_s(attempts)))
    with transaction.atomic():
        DeliveryAttempt.objects.create(delivery_id=delivery.pk, at=started, ok=result.ok,
                                       status_code=result.status_code,
                                       error=result.error[:ERROR_MAX], duration_ms=duration_ms)
        # Conditional on the attempt count the claim saw: a worker whose claim lapsed mid-send
        # records its attempt without overwriting the outcome of whoever took over.
        updated = Delivery.objects.filter(pk=delivery.pk, attempts=delivery.attempts
                                          ).update(**fields)
    if not updated:
        log.warning("alert delivery %s was attempted elsewhere while %s sent it", delivery.pk,
                    notifier)
    if not result.ok:
        log.warning("alert delivery %s to %s failed (attempt %d of %d): %s", delivery.pk,
                    notifier, attempts, notifier.max_attempts, result.error)
