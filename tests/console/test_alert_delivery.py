"""Alert notifications end to end: the evaluator's notices become Delivery rows, and the delivery
worker sends them to real local receivers (an HTTP server, an SMTP server) in Alertmanager's
version 4 format, retries with backoff, records each attempt, and does not let one hanging
receiver hold up another."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session
from django.utils import timezone

from console.accounts.models import Team
from console.alerts.delivery import (
    ZERO_TIME,
    DeliveryWorker,
    Notice,
    backoff_s,
    enqueue,
    rfc3339,
)
from console.alerts.evaluation import Evaluator
from console.alerts.models import Alert, AlertRule, AlertState, Delivery, DeliveryAttempt, Notifier
from console.deployments.models import Deployment
from tests.console.sockets import free_port, wait_for
from tests.console.test_alert_evaluation import _healthy, _running

pytestmark = pytest.mark.django_db(transaction=True)

EXTERNAL_URL = "http://console.example:8000"
PAYLOAD_KEYS = {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
                "commonLabels", "commonAnnotations", "externalURL", "alerts"}
ALERT_KEYS = {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
              "fingerprint"}


# ---- a real HTTP receiver ----------------------------------------------------------------------
@dataclass
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    at: float  # time.monotonic() on arrival


class Receiver(ThreadingHTTPServer):
    """Answers each POST with the next of ``statuses`` (then 200), after ``hold_s``; with
    ``trickle_s``, its body a byte at a time, that long apart."""

    def __init__(self, statuses: list[int] | None = None, hold_s: float = 0.0,
                 trickle_s: float = 0.0) -> None:
        self.statuses = list(statuses or [])
        self.hold_s = hold_s
        self.trickle_s = trickle_s
        self.received: list[Received] = []
        self.release = threading.Event()  # ends a hold early, at teardown
        super().__init__(("127.0.0.1", 0), _ReceiverHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, *_args: object) -> None:
        return None

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append(Received(body, dict(self.headers), time.monotonic()))
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        if self.server.hold_s:
            self.server.release.wait(self.server.hold_s)
        answer = b"receiver says no" if status >= 300 else b"ok"
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            for index in range(len(answer)):
                if self.server.trickle_s:
                    self.wfile.flush()
                    if self.server.release.wait(self.server.trickle_s):
                        return
                self.wfile.write(answer[index:index + 1])
        except OSError:
            pass  # a client that timed out already hung up: that is what the test is about


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(statuses: list[int] | None = None, hold_s: float = 0.0,
              trickle_s: float = 0.0) -> Receiver:
        server = Receiver(statuses, hold_s, trickle_s)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


# ---- a real SMTP server ------------------------------------------------------------------------
@dataclass
class Mailbox:
    refuse: set[str] = field(default_factory=set)
    messages: list[Envelope] = field(default_factory=list)

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,  # noqa: N802
                          address: str, rcpt_options: list[str]) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session,  # noqa: N802 - aiosmtpd's naming
                          envelope: Envelope) -> str:
        self.messages.append(envelope)
        return "250 Message accepted"


@pytest.fixture
def smtp(settings: Any) -> Iterator[Mailbox]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    # pytest-django swaps in the locmem backend; these tests go through real SMTP.
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.DEFAULT_FROM_EMAIL = "pdserve@example.org"
    yield mailbox
    controller.stop()


# ---- rows --------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def external_url(settings: Any) -> None:
    settings.PDSERVE_EXTERNAL_URL = EXTERNAL_URL


@pytest.fixture(autouse=True)
def loopback_receivers(settings: Any) -> None:
    # The receivers here listen on 127.0.0.1, which webhooks reach only where the deployer
    # allows it (tests/console/test_alert_notifier_targets.py).
    settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)


@pytest.fixture
def worker() -> Iterator[DeliveryWorker]:
    delivery_worker = DeliveryWorker(poll_s=0.05)
    yield delivery_worker
    delivery_worker.stop()


def make_rule(deployment: Deployment, name: str = "worker down", severity: str = "critical"
              ) -> AlertRule:
    # The deployment has the ready-made rules already: a key of its own keeps this one apart.
    return AlertRule.objects.create(deployment=deployment, key="t_" + name.replace(" ", "_"),
                                    name=name,
                                    series="worker.up", aggregation="last", comparison="<",
                                    threshold=1, severity=severity, scope="instance")


def make_alert(rule: AlertRule, process: str = "decode-0", fired_at: datetime | None = None
               ) -> Alert:
    labels = {"alertname": rule.alertname, "deployment": rule.deployment.name,
              "severity": rule.severity, "series": rule.series, "role": process.split("-")[0],
              "process": process, "rule": rule.key}
    fired = fired_at or timezone.now() - timedelta(seconds=30)
    digest = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return Alert.objects.create(
        rule=rule, deployment=rule.deployment, fingerprint=digest,
        labels=labels, annotations={"summary": f"{process} is down", "runbook_url": "https://r/1"},
        state=AlertState.FIRING, value=0.0, active_since=fired, fired_at=fired,
        last_true_at=fired, evaluated_at=fired)


def resolve(alert: Alert, at: datetime) -> Alert:
    alert.state, alert.resolved_at, alert.evaluated_at = AlertState.INACTIVE, at, at
    alert.save()
    return alert


def webhook(url: str, name: str = "ops", **fields: Any) -> Notifier:
    return Notifier.objects.create(name=name, kind=Notifier.Kind.WEBHOOK, url=url, **fields)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# ---- the webhook -------------------------------------------------------------------------------
def test_a_receiver_gets_alertmanagers_v4_payload_when_firing_then_resolved(
        deployment: Deployment, receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    receiver = receivers()
    webhook(receiver.url)
    rule = make_rule(deployment)
    decode, prefill = make_alert(rule, "decode-0"), make_alert(rule, "prefill-0")

    now = timezone.now()
    created = enqueue([Notice(decode, "firing", False), Notice(prefill, "firing", False)], now)
    # Enqueueing only writes rows: the evaluator's tick never waits on a receiver.
    assert receiver.received == []
    assert [d.state for d in created] == [Delivery.State.PENDING]
    assert set(created[0].alerts.values_list("pk", flat=True)) == {decode.pk, prefill.pk}

    assert worker.run_once(timezone.now()) == 1
    [firing] = receiver.received
    body = firing.body
    assert firing.headers["Content-Type"] == "application/json"
    assert set(body) == PAYLOAD_KEYS
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "ops"
    assert body["truncatedAlerts"] == 0
    assert body["externalURL"] == EXTERNAL_URL
    assert body["groupLabels"] == {"alertname": "WorkerDown", "deployment": deployment.name}
    assert body["groupKey"] == f'{{}}:{{alertname="WorkerDown", deployment="{deployment.name}"}}'
    # The two alerts differ in process and role only: the rest is common to the group.
    assert body["commonLabels"] == {k: v for k, v in decode.labels.items()
                                    if k not in ("process", "role")}
    assert body["commonAnnotations"] == {"runbook_url": "https://r/1"}
    by_process = {a["labels"]["process"]: a for a in body["alerts"]}
    assert set(by_process) == {"decode-0", "prefill-0"}
    sent = by_process["decode-0"]
    assert set(sent) == ALERT_KEYS
    assert sent["status"] == "firing"
    assert sent["labels"] == decode.labels
    assert sent["annotations"] == decode.annotations
    assert sent["startsAt"].endswith("Z")
    assert parse_time(sent["startsAt"]) == decode.fired_at
    assert sent["endsAt"] == ZERO_TIME
    assert sent["generatorURL"] == f"{EXTERNAL_URL}/alerts/{decode.pk}/"
    assert sent["fingerprint"] == decode.fingerprint
    delivery = Delivery.objects.get(pk=created[0].pk)
    assert (delivery.state, delivery.attempts, delivery.status) == (Delivery.State.SENT, 1, "firing")
    [attempt] = delivery.attempt_log.all()
    assert (attempt.ok, attempt.status_code, attempt.error) == (True, 200, "")
    assert attempt.duration_ms > 0

    resolved_at = timezone.now()
    enqueue([Notice(resolve(decode, resolved_at), "resolved", False)], resolved_at)
    assert worker.run_once(timezone.now()) == 1
    body = receiver.received[1].body
    assert (body["status"], body["version"], len(body["alerts"])) == ("resolved", "4", 1)
    [sent] = body["alerts"]
    assert sent["status"] == "resolved"
    assert parse_time(sent["startsAt"]) == decode.fired_at
    assert parse_time(sent["endsAt"]) == resolved_at
    assert body["commonLabels"] == decode.labels
    assert worker.run_once(timezone.now()) == 0  # nothing left to send


def test_rfc3339_is_alertmanagers_utc_form() -> None:
    at = datetime(2026, 3, 1, 12, 30, 5, 250000, tzinfo=UTC)
    assert rfc3339(at) == "2026-03-01T12:30:05.25Z"
    assert rfc3339(at.replace(microsecond=0)) == "2026-03-01T12:30:05Z"


def test_alerts_group_by_notifier_alertname_deployment_and_status(
        deployment: Deployment, receivers: Callable[..., Receiver]) -> None:
    receiver = receivers()
    ops, oncall = webhook(receiver.url, "ops"), webhook(receiver.url, "oncall")
    down, queue = make_rule(deployment), make_rule(deployment, "decode queue", "warning")
    a, b, c = make_alert(down, "decode-0"), make_alert(down, "prefill-0"), make_alert(queue)
    now = timezone.now()
    d = make_alert(down, "decode-1")
    resolve(d, now)
    created = enqueue([Notice(a, "firing", False), Notice(b, "firing", False),
                       Notice(c, "firing", False), Notice(d, "resolved", False)], now)
    groups = {(x.notifier.name, x.payload["groupLabels"]["alertname"], x.status):
              sorted(alert["labels"]["process"] for alert in x.payload["alerts"]) for x in created}
    expected: dict[tuple[str, str, str], list[str]] = {}
    for name in (ops.name, oncall.name):
        expected[(name, "WorkerDown", "firing")] = ["decode-0", "prefill-0"]
        expected[(name, "DecodeQueue", "firing")] = ["decode-0"]
        expected[(name, "WorkerDown", "resolved")] = ["decode-1"]
    assert groups == expected
    assert all(x.next_attempt_at == now and x.deployment_id == deployment.pk for x in created)
    assert {x.payload["receiver"] for x in created} == {"ops", "oncall"}


def test_a_failing_receiver_is_retried_with_backoff_until_it_answers(
        deployment: Deployment, receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    receiver = receivers(statuses=[500, 500, 200])
    webhook(receiver.url, max_attempts=5)
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    worker.start()
    wait_for(lambda: Delivery.objects.get(pk=delivery.pk).state == Delivery.State.SENT,
             "the third attempt to succeed", timeout=15)
    attempts = list(Delivery.objects.get(pk=delivery.pk).attempt_log.order_by("at"))
    assert [(a.ok, a.status_code) for a in attempts] == [(False, 500), (False, 500), (True, 200)]
    # The status, not the reply: a receiver on an allowed internal network is any service there.
    assert attempts[0].error == "HTTP 500 Internal Server Error"
    assert len(receiver.received) == 3
    # 1 s after the first failure, 2 s after the second (plus at most 10 % jitter and a poll).
    # Never sooner; later only by the machine's scheduling (a loaded CI machine once took 2.18 s
    # for the first), so the upper bounds stop short of the next backoff's value.
    first_gap = (attempts[1].at - attempts[0].at).total_seconds()
    second_gap = (attempts[2].at - attempts[1].at).total_seconds()
    assert 1.0 <= first_gap < 2.0, first_gap
    assert 2.0 <= second_gap < 4.0, second_gap
    assert Delivery.objects.get(pk=delivery.pk).attempts == 3


def test_a_delivery_fails_after_max_attempts(
        deployment: Deployment, receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    receiver = receivers(statuses=[503, 503, 503])
    webhook(receiver.url, max_attempts=2)
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    assert worker.run_once(timezone.now()) == 1
    pending = Delivery.objects.get(pk=delivery.pk)
    assert (pending.state, pending.attempts) == (Delivery.State.PENDING, 1)
    assert pending.next_attempt_at > timezone.now()  # backing off, not due yet
    assert worker.run_once(timezone.now()) == 0
    # Later than the backoff: due again, and the last attempt gives up.
    assert worker.run_once(timezone.now() + timedelta(seconds=5)) == 1
    failed = Delivery.objects.get(pk=delivery.pk)
    assert (failed.state, failed.attempts) == (Delivery.State.FAILED, 2)
    assert failed.finished_at is not None
    assert [a.status_code for a in failed.attempt_log.all()] == [503, 503]
    assert len(receiver.received) == 2


def test_a_receiver_that_is_not_listening_is_a_recorded_failure(
        deployment: Deployment, worker: DeliveryWorker) -> None:
    webhook(f"http://127.0.0.1:{free_port()}/hook")
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    assert worker.run_once(timezone.now()) == 1
    [attempt] = Delivery.objects.get(pk=delivery.pk).attempt_log.all()
    assert (attempt.ok, attempt.status_code) == (False, None)
    assert "ConnectError" in attempt.error


def test_a_hanging_receiver_times_out_without_holding_up_another(
        deployment: Deployment, receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    hanging, healthy = receivers(hold_s=10.0), receivers()
    slow = webhook(hanging.url, "slow", timeout_s=1.5)
    fast = webhook(healthy.url, "fast", timeout_s=1.5)
    enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)], timezone.now())

    started = time.monotonic()
    assert worker.run_once(timezone.now()) == 2
    took = time.monotonic() - started
    [arrived] = healthy.received
    assert arrived.at - started < 0.7, arrived.at - started
    sent = Delivery.objects.get(notifier=fast)
    assert sent.state == Delivery.State.SENT
    [fast_attempt] = sent.attempt_log.all()
    assert fast_attempt.duration_ms < 700
    # The healthy delivery was recorded long before the hanging one timed out.
    assert sent.finished_at is not None
    assert (sent.finished_at - fast_attempt.at).total_seconds() < 0.7
    stuck = Delivery.objects.get(notifier=slow)
    [slow_attempt] = stuck.attempt_log.all()
    assert (slow_attempt.ok, slow_attempt.status_code) == (False, None)
    assert "no answer within 1.5 s" in slow_attempt.error
    assert 1400 <= slow_attempt.duration_ms < 2500, slow_attempt.duration_ms
    assert stuck.state == Delivery.State.PENDING and stuck.attempts == 1
    assert took < 3.0, took
    assert len(hanging.received) == 1


def test_the_timeout_bounds_the_whole_request_not_each_read(
        deployment: Deployment, receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    # Headers at once, then "ok" a byte every 1.2 s: no single read waits past 1.5 s, the whole
    # answer takes 2.4 s.
    receiver = receivers(trickle_s=1.2)
    webhook(receiver.url, timeout_s=1.5)
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    assert worker.run_once(timezone.now()) == 1
    [attempt] = Delivery.objects.get(pk=delivery.pk).attempt_log.all()
    assert not attempt.ok
    assert "no answer within 1.5 s" in attempt.error
    assert 1400 <= attempt.duration_ms < 2200, attempt.duration_ms
    assert len(receiver.received) == 1


def test_a_delivery_being_sent_is_not_picked_by_another_worker(
        deployment: Deployment, receivers: Callable[..., Receiver]) -> None:
    receiver = receivers(hold_s=1.0)
    webhook(receiver.url)
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    first, second = DeliveryWorker(), DeliveryWorker()
    counts: list[int] = []
    sending = threading.Thread(target=lambda: counts.append(first.run_once(timezone.now())))
    sending.start()
    wait_for(lambda: len(receiver.received) == 1, "the first worker to be sending")
    # Still due by its original time, but claimed: another console's worker leaves it alone.
    assert second.run_once(timezone.now()) == 0
    sending.join(timeout=10)
    for each in (first, second):
        each.stop()
    assert counts == [1]
    assert len(receiver.received) == 1
    assert Delivery.objects.get(pk=delivery.pk).attempt_log.count() == 1


# ---- who is notified ---------------------------------------------------------------------------
def test_a_muted_firing_alert_is_not_sent(deployment: Deployment) -> None:
    webhook("http://127.0.0.1:9/hook")
    alert = make_alert(make_rule(deployment))
    assert enqueue([Notice(alert, "firing", True)], timezone.now()) == []
    assert Delivery.objects.count() == 0
    assert len(enqueue([Notice(alert, "firing", False)], timezone.now())) == 1


def test_a_muted_resolution_is_sent_only_where_asked_for(deployment: Deployment) -> None:
    default = webhook("http://127.0.0.1:9/a", "default")
    asked = webhook("http://127.0.0.1:9/b", "asked", send_resolved_when_silenced=True)
    webhook("http://127.0.0.1:9/c", "never", send_resolved=False,
            send_resolved_when_silenced=True)
    alert = resolve(make_alert(make_rule(deployment)), timezone.now())

    muted = enqueue([Notice(alert, "resolved", True)], timezone.now())
    assert [d.notifier_id for d in muted] == [asked.pk]
    plain = enqueue([Notice(alert, "resolved", False)], timezone.now())
    assert sorted(d.notifier_id for d in plain) == sorted([default.pk, asked.pk])


def test_min_severity_filters_what_a_notifier_hears(deployment: Deployment) -> None:
    critical_only = webhook("http://127.0.0.1:9/a", "pager", min_severity="critical")
    warnings = webhook("http://127.0.0.1:9/b", "chat", min_severity="warning")
    everything = webhook("http://127.0.0.1:9/c", "log", min_severity="info")
    levels = {severity: make_alert(make_rule(deployment, f"{severity} thing", severity))
              for severity in ("critical", "warning", "info")}
    heard = {severity: sorted(d.notifier_id for d in enqueue([Notice(alert, "firing", False)],
                                                               timezone.now()))
             for severity, alert in levels.items()}
    assert heard == {"critical": sorted([critical_only.pk, warnings.pk, everything.pk]),
                     "warning": sorted([warnings.pk, everything.pk]),
                     "info": [everything.pk]}


def test_only_the_deployments_team_and_enabled_notifiers_hear(deployment: Deployment) -> None:
    other = Team.objects.create(name="other")
    Notifier.objects.create(team=other, name="theirs", kind=Notifier.Kind.WEBHOOK,
                            url="http://127.0.0.1:9/a")
    webhook("http://127.0.0.1:9/b", "off", enabled=False)
    ours = webhook("http://127.0.0.1:9/c", "ours")
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    assert delivery.notifier_id == ours.pk


def test_backoff_doubles_from_one_second_to_a_minute() -> None:
    for failures, base in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0)):
        assert base <= backoff_s(failures) <= base * 1.1
    assert backoff_s(7) == backoff_s(30) == 60.0


# ---- email -------------------------------------------------------------------------------------
def test_email_goes_through_a_real_smtp_server(
        deployment: Deployment, smtp: Mailbox, worker: DeliveryWorker) -> None:
    Notifier.objects.create(name="mail", kind=Notifier.Kind.EMAIL,
                            recipients=["oncall@example.org"])
    rule = make_rule(deployment)
    decode, prefill = make_alert(rule, "decode-0"), make_alert(rule, "prefill-0")
    [delivery] = enqueue([Notice(decode, "firing", False), Notice(prefill, "firing", False)],
                         timezone.now())
    assert worker.run_once(timezone.now()) == 1
    [envelope] = smtp.messages
    assert envelope.rcpt_tos == ["oncall@example.org"]
    assert envelope.mail_from == "pdserve@example.org"
    message = envelope.content.decode()
    assert (f"Subject: [FIRING:2] WorkerDown {deployment.name} (t_worker_down worker.up critical)"
            in message)
    assert "2 alerts for alertname=WorkerDown deployment=" in message
    assert "process = decode-0" in message and "process = prefill-0" in message
    assert "summary = decode-0 is down" in message
    assert f"Starts at: {rfc3339(decode.fired_at or timezone.now())}" in message
    assert "Ends at: still firing" in message
    assert f"{EXTERNAL_URL}/alerts/{decode.pk}/" in message
    [attempt] = Delivery.objects.get(pk=delivery.pk).attempt_log.all()
    assert attempt.ok

    resolved_at = timezone.now()
    enqueue([Notice(resolve(decode, resolved_at), "resolved", False)], resolved_at)
    assert worker.run_once(timezone.now()) == 1
    message = smtp.messages[1].content.decode()
    assert "Subject: [RESOLVED] WorkerDown" in message
    assert f"Ends at: {rfc3339(resolved_at)}" in message


def test_a_refused_recipient_is_a_recorded_failure(
        deployment: Deployment, smtp: Mailbox, worker: DeliveryWorker) -> None:
    smtp.refuse.add("nobody@example.org")
    Notifier.objects.create(name="mail", kind=Notifier.Kind.EMAIL,
                            recipients=["nobody@example.org"])
    [delivery] = enqueue([Notice(make_alert(make_rule(deployment)), "firing", False)],
                         timezone.now())
    assert worker.run_once(timezone.now()) == 1
    [attempt] = Delivery.objects.get(pk=delivery.pk).attempt_log.all()
    assert not attempt.ok
    assert "nobody@example.org (550" in attempt.error
    assert smtp.messages == []


@pytest.mark.django_db(transaction=True)
def test_a_hanging_receiver_does_not_delay_the_next_evaluation(
        deployment: Deployment, receivers: Callable[..., Receiver],
        worker: DeliveryWorker) -> None:
    hanging = receivers(hold_s=6)
    webhook(hanging.url, timeout_s=3)
    _running(deployment, restarts=1)
    now = timezone.now()
    _healthy(deployment, now - timedelta(seconds=1), decode_up=0)
    evaluator = Evaluator(holder="test")
    assert evaluator.tick(now).transitions >= 1
    worker.start()
    deadline = time.monotonic() + 10
    while not hanging.received and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hanging.received, "the worker never called the receiver"
    # The receiver holds the worker's call; the evaluator's next tick does not wait for it.
    _healthy(deployment, now + timedelta(seconds=4))
    started = time.monotonic()
    report = evaluator.tick(now + timedelta(seconds=5))
    took = time.monotonic() - started
    assert report.evaluated and report.transitions >= 1 and took < 1.0, took
    assert Delivery.objects.filter(state=Delivery.State.PENDING).count() >= 1
    assert not DeliveryAttempt.objects.exists()  # the first attempt is still in flight
