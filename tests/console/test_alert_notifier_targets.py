"""Webhook targets (issue 23, item 4): a notifier cannot point the console at its own network.

Internal addresses and credentials in the URL are refused when a notifier is saved (a 400
naming ``url``) unless PDSERVE_WEBHOOK_ALLOWED_NETWORKS names the network; a name that
resolves to an internal address when the request is sent is refused then; redirects are not
followed; a reply is read up to a cap; a team whose receivers hang does not delay another
team's alerts; viewers and the audit log see a webhook's URL masked.

Receivers are real HTTP servers on 127.0.0.1, allowed through the setting; only DNS is patched
(``socket.getaddrinfo``) where a name must resolve to a given address.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from unittest import mock

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone

from console.accounts.models import Role, Team
from console.alerts.api.serializers import NotifierSerializer
from console.alerts.delivery import DeliveryWorker
from console.alerts.models import Delivery, Notifier
from console.alerts.notifiers import targets
from console.alerts.notifiers.targets import Target, check_url, masked_url
from console.alerts.notifiers.webhook import EXCERPT, _result
from console.audit.models import AuditEntry
from console.env import env_networks
from tests.console.sockets import wait_for
from tests.console.team_users import Crew, api_as, make_crew, member

pytestmark = pytest.mark.django_db(transaction=True)

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
SECRET = "T000/B000/XXXXsecretXXXX"
PUBLIC_URL = f"https://hooks.example.com/services/{SECRET}?token=s3cret"


# ---- receivers ---------------------------------------------------------------------------------
class Receiver(ThreadingHTTPServer):
    """A real HTTP server on 127.0.0.1. ``answer`` (handler -> None) replies; by default 200."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None] | None = None) -> None:
        self.answer = answer
        self.requests: list[dict[str, str]] = []  # each request's headers
        self.arrivals: list[float] = []  # time.monotonic() of each
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = threading.Event()  # ends holds and endless replies at teardown
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def log_message(self, *_args: object) -> None:
        return None

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.requests.append(dict(self.headers))
            self.server.arrivals.append(time.monotonic())
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        try:
            if self.server.answer is not None:
                self.server.answer(self)
            else:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
        except OSError:
            pass  # the sender hung up: what some tests are about
        finally:
            with self.server.lock:
                self.server.in_flight -= 1


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(answer: Callable[[BaseHTTPRequestHandler], None] | None = None) -> Receiver:
        server = Receiver(answer)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def allow_loopback(settings: Any) -> None:
    settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK


@pytest.fixture
def worker() -> Iterator[DeliveryWorker]:
    delivery_worker = DeliveryWorker(poll_s=0.05)
    yield delivery_worker
    delivery_worker.stop()


def dns(answers: dict[str, list[list[str]]]) -> Any:
    """``socket.getaddrinfo`` answering each name of ``answers`` with its next list of addresses
    (the last one again when they ran out), and every other host as the real resolver does."""
    real = socket.getaddrinfo
    calls: dict[str, int] = {}  # name: times asked

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in answers:
            return real(host, port, *args, **kwargs)
        index = calls.get(name, 0)
        calls[name] = index + 1
        addresses = answers[name][min(index, len(answers[name]) - 1)]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, int(port or 0))) for a in addresses]

    return mock.patch("socket.getaddrinfo", autospec=True, side_effect=getaddrinfo)


def webhook(url: str, team: Team | None = None, name: str = "ops", **fields: Any) -> Notifier:
    # Straight into the table: what the send-time checks must catch whatever was saved.
    extra = {"team": team} if team is not None else {}
    return Notifier.objects.create(name=name, kind=Notifier.Kind.WEBHOOK, url=url, **extra,
                                   **fields)


def due(notifier: Notifier, count: int = 1) -> list[Delivery]:
    return [Delivery.objects.create(notifier=notifier, status="firing", payload={"n": index},
                                    next_attempt_at=timezone.now())
            for index in range(count)]


def only_attempt(delivery: Delivery) -> Any:
    [attempt] = Delivery.objects.get(pk=delivery.pk).attempt_log.all()
    return attempt


# ---- refused when saved ------------------------------------------------------------------------
INTERNAL = [
    ("http://127.0.0.1:6379/", "127.0.0.0/8"),                   # Redis on loopback
    ("http://[::1]:5432/", "::1/128"),                            # PostgreSQL on loopback
    ("http://localhost:8000/", "127.0.0.1/32"),                   # RFC 6761: always loopback
    ("http://169.254.169.254/latest/meta-data/", "169.254.0.0/16"),  # cloud metadata
    ("http://[fd00:ec2::254]/latest/meta-data/", "fd00::/8"),     # EC2's IPv6 metadata
    ("http://[fe80::1]/", "fe80::/10"),                           # link-local
    ("http://10.1.2.3/", "10.0.0.0/8"),                           # RFC 1918
    ("http://172.16.0.9/", "172.16.0.0/12"),
    ("http://192.168.1.1/", "192.168.0.0/16"),
    ("http://[fc00::1]/", "fc00::/7"),                            # unique local
    ("http://100.64.0.1/", "100.64.0.0/10"),                      # CGNAT
    ("http://0.0.0.0:8000/", "0.0.0.0/32"),                       # unspecified
    ("http://[::]:8000/", "::/128"),
    ("http://224.0.0.1/", "224.0.0.0/4"),                         # multicast
    ("http://[ff02::1]/", "ff00::/8"),
    ("http://240.0.0.1/", "240.0.0.0/4"),                         # reserved
    ("http://[::ffff:127.0.0.1]:6379/", "127.0.0.0/8"),           # IPv4-mapped
    ("http://[::ffff:169.254.169.254]/", "169.254.0.0/16"),
    ("http://[64:ff9b::a01:203]/", "10.0.0.0/8"),                 # NAT64 of 10.1.2.3
    ("http://[2002:7f00:1::]/", "127.0.0.0/8"),                   # 6to4 of 127.0.0.1
]


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


def _create(client: Any, url: str, name: str = "pager") -> Any:
    return client.post("/api/v1/notifiers/", {"team": "default", "name": name, "kind": "webhook",
                                              "url": url}, format="json")


@pytest.mark.parametrize(("url", "network"), INTERNAL)
def test_an_internal_address_is_refused_unless_its_network_is_allowed(
        crew: Crew, settings: Any, url: str, network: str) -> None:
    admin = api_as(crew.admin)
    refused = _create(admin, url)
    assert refused.status_code == 400, refused.content
    assert set(refused.json()) == {"url"}
    assert "PDSERVE_WEBHOOK_ALLOWED_NETWORKS" in refused.json()["url"][0]
    assert not Notifier.objects.exists()

    settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network(network),)
    allowed = _create(admin, url)
    assert allowed.status_code == 201, allowed.content
    assert Notifier.objects.get().url == url


def test_another_network_allowed_does_not_let_an_address_through(crew: Crew, settings: Any) -> None:
    settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("10.0.0.0/8"),)
    assert _create(api_as(crew.admin), "http://169.254.169.254/").status_code == 400


@pytest.mark.parametrize("url", ["https://user:password@hooks.example.com/x",
                                 "https://token@hooks.example.com/x",
                                 "ftp://hooks.example.com/x"])
def test_credentials_in_the_url_and_other_schemes_are_refused(
        crew: Crew, settings: Any, url: str) -> None:
    settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS = (ipaddress.ip_network("0.0.0.0/0"),)
    refused = _create(api_as(crew.admin), url)
    assert refused.status_code == 400, refused.content
    assert set(refused.json()) == {"url"}


def test_a_public_url_is_accepted_and_names_are_not_resolved_on_save(crew: Crew) -> None:
    with dns({"hooks.example.com": [["127.0.0.1"]]}) as resolver:
        created = _create(api_as(crew.admin), PUBLIC_URL)
    assert created.status_code == 201, created.content
    # A name's answer is checked where it counts, at each send: it may change meanwhile.
    assert resolver.call_count == 0


def test_the_notifiers_page_refuses_an_internal_address_on_its_url_field(crew: Crew) -> None:
    client = Client()
    client.force_login(crew.admin)
    response = client.post("/alerts/notifiers/new/", {
        "team": str(crew.team.pk), "name": "pager", "kind": "webhook", "enabled": "on",
        "url": "http://169.254.169.254/latest/meta-data/", "recipients": "[]",
        "send_resolved": "on", "min_severity": "info", "timeout_s": "5", "max_attempts": "5"})
    assert response.status_code == 400
    assert "PDSERVE_WEBHOOK_ALLOWED_NETWORKS" in " ".join(response.context["form"].errors["url"])
    assert not Notifier.objects.exists()


def test_check_url_reads_every_form_of_an_address() -> None:
    # With the C resolver's shorthands, which the URL field refuses before.
    shorthands = ["http://127.1:6379/", "http://2130706433/", "http://0x7f000001/"]
    for url in [url for url, _network in INTERNAL] + shorthands:
        with pytest.raises(targets.TargetRefused):
            check_url(url)
    for url in (PUBLIC_URL, "http://93.184.215.14:8080/x", "http://[2606:4700::1111]/x"):
        check_url(url)


# ---- refused when sent -------------------------------------------------------------------------
def test_a_name_resolving_to_an_internal_address_is_refused_when_sent(
        receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    receiver = receivers()
    [delivery] = due(webhook(f"http://hooks.pdserve.test:{receiver.port}/hook"))
    with dns({"hooks.pdserve.test": [["127.0.0.1"]]}):
        assert worker.run_once(timezone.now()) == 1
    attempt = only_attempt(delivery)
    assert (attempt.ok, attempt.status_code) == (False, None)
    assert attempt.error.startswith("refused: hooks.pdserve.test resolves to 127.0.0.1 is a "
                                    "loopback address"), attempt.error
    assert receiver.requests == []


def test_one_internal_answer_among_public_ones_is_refused(
        receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    receiver = receivers()
    [delivery] = due(webhook(f"http://hooks.pdserve.test:{receiver.port}/hook"))
    with dns({"hooks.pdserve.test": [["93.184.215.14", "10.0.0.5"]]}):
        assert worker.run_once(timezone.now()) == 1
    assert "10.0.0.5 is a private address" in only_attempt(delivery).error
    assert receiver.requests == []


def test_a_row_with_an_internal_address_is_refused_when_sent(
        receivers: Callable[..., Receiver], worker: DeliveryWorker) -> None:
    # Saved before the checks existed, or straight into the table.
    receiver = receivers()
    [delivery] = due(webhook(receiver.url))
    assert worker.run_once(timezone.now()) == 1
    assert "127.0.0.1 is a loopback address" in only_attempt(delivery).error
    assert receiver.requests == []


def test_an_allowed_name_is_connected_at_the_address_checked_with_its_host_kept(
        receivers: Callable[..., Receiver], worker: DeliveryWorker, allow_loopback: None) -> None:
    receiver = receivers()
    [delivery] = due(webhook(f"http://hooks.pdserve.test:{receiver.port}/hook"))
    # The first answer is checked and used; a later one (DNS rebinding) would be refused, and
    # is never asked for.
    with dns({"hooks.pdserve.test": [["127.0.0.1"], ["10.0.0.5"]]}) as resolver:
        assert worker.run_once(timezone.now()) == 1
        asked = [call for call in resolver.call_args_list if call.args[0] == "hooks.pdserve.test"]
        assert len(asked) == 1
    assert only_attempt(delivery).ok
    [headers] = receiver.requests
    assert headers["Host"] == f"hooks.pdserve.test:{receiver.port}"


def test_redirects_are_not_followed(
        receivers: Callable[..., Receiver], worker: DeliveryWorker, allow_loopback: None) -> None:
    inside = receivers()

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("Location", inside.url)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    outside = receivers(redirect)
    [delivery] = due(webhook(outside.url))
    assert worker.run_once(timezone.now()) == 1
    attempt = only_attempt(delivery)
    assert (attempt.ok, attempt.status_code) == (False, 307)
    assert attempt.error == "HTTP 307 Temporary Redirect: redirects are not followed"
    assert len(outside.requests) == 1 and inside.requests == []


@pytest.mark.parametrize("status", [200, 500])
def test_a_huge_reply_is_read_up_to_the_cap(
        receivers: Callable[..., Receiver], worker: DeliveryWorker, allow_loopback: None,
        status: int) -> None:
    sent: list[int] = []

    def endless(handler: BaseHTTPRequestHandler) -> None:
        # Chunked and never ending: megabytes a second until the sender hangs up.
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        chunk = b"x" * 65536
        sent.append(0)
        while not handler.server.release.is_set():  # type: ignore[attr-defined]
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent[0] += len(chunk)

    receiver = receivers(endless)
    [delivery] = due(webhook(receiver.url, timeout_s=10))
    started = time.monotonic()
    assert worker.run_once(timezone.now()) == 1
    took = time.monotonic() - started
    attempt = only_attempt(delivery)
    # Not read until the timeout: the sender stopped at the cap and hung up.
    assert took < 3.0, took
    assert attempt.status_code == status
    assert attempt.ok == (status == 200)
    assert len(attempt.error) < 100, attempt.error
    assert "xxx" not in attempt.error
    assert "no answer" not in attempt.error


def test_a_public_receivers_reply_is_kept_as_a_short_printable_excerpt() -> None:
    public = Target(ipaddress.ip_address("93.184.215.14"), allowed_by_setting=False)
    allowed = Target(ipaddress.ip_address("10.0.0.5"), allowed_by_setting=True)
    body = b'{"error": "invalid_token",\n\x1b[31m "detail": "' + b"y" * 5000 + b'"}'
    refusal = httpx.Response(403, headers={"Content-Type": "application/json"}, content=body)
    error = _result(refusal, body, public).error
    assert error.startswith('HTTP 403 Forbidden: {"error": "invalid_token", [31m "detail"')
    assert len(error) <= len("HTTP 403 Forbidden: ") + EXCERPT
    assert "\n" not in error and "\x1b" not in error
    # From an address only the deployer's allowance lets through: the status alone.
    assert _result(refusal, body, allowed).error == "HTTP 403 Forbidden"
    # Not text: the status alone; and the receiver's own reason phrase is not repeated.
    binary = httpx.Response(500, headers={"Content-Type": "application/octet-stream"},
                            content=b"\x00secret", extensions={"reason_phrase": b"pwned"})
    assert _result(binary, b"\x00secret", public).error == "HTTP 500 Internal Server Error"


# ---- fairness between teams --------------------------------------------------------------------
def test_a_team_whose_receivers_hang_does_not_delay_another_teams_alerts(
        receivers: Callable[..., Receiver], worker: DeliveryWorker, allow_loopback: None) -> None:
    def hang(handler: BaseHTTPRequestHandler) -> None:
        handler.server.release.wait(10)  # type: ignore[attr-defined]

    hanging, healthy = receivers(hang), receivers()
    slow_team, quick_team = Team.objects.create(name="slow"), Team.objects.create(name="quick")
    # The slow team's ten deliveries are older than the quick team's one.
    for index in range(10):
        due(webhook(hanging.url, slow_team, name=f"slow-{index}", timeout_s=4))
    time.sleep(0.05)
    [quick] = due(webhook(healthy.url, quick_team, name="quick", timeout_s=4))

    started = time.monotonic()
    worker.start()
    deadline = started + 3
    while not healthy.arrivals and time.monotonic() < deadline:
        time.sleep(0.02)
    assert healthy.arrivals, "the quick team's alert waited for the slow team's receivers"
    assert healthy.arrivals[0] - started < 1.0, healthy.arrivals[0] - started
    deadline = time.monotonic() + 2
    while not Delivery.objects.get(pk=quick.pk).state == Delivery.State.SENT:
        assert time.monotonic() < deadline, "the quick team's delivery was not recorded"
        time.sleep(0.02)
    # The slow team holds its share of the senders meanwhile, and no more.
    wait_for(lambda: len(hanging.requests) == worker.per_team, "the slow team's sends")
    time.sleep(0.3)
    assert hanging.most_in_flight == len(hanging.requests) == worker.per_team < worker.senders


def test_free_senders_go_round_robin_between_teams(
        receivers: Callable[..., Receiver], allow_loopback: None) -> None:
    receiver = receivers()
    teams = [Team.objects.create(name=f"t{index}") for index in range(3)]
    for team in teams:
        due(webhook(receiver.url, team, name=f"{team.name}-hook"), count=3)
    one_each = DeliveryWorker(senders=3, per_team=3)
    try:
        assert one_each.run_once(timezone.now()) == 3
    finally:
        one_each.stop()
    sent = Delivery.objects.filter(state=Delivery.State.SENT)
    assert sorted(sent.values_list("notifier__team__name", flat=True)) == ["t0", "t1", "t2"]


# ---- who sees the URL --------------------------------------------------------------------------
def test_viewers_see_a_masked_url_and_admins_the_whole_one(crew: Crew) -> None:
    notifier = webhook(PUBLIC_URL, crew.team)
    masked = "https://hooks.example.com/…"
    assert masked_url(PUBLIC_URL) == masked
    path = f"/api/v1/notifiers/{notifier.pk}/"
    for user in (crew.viewer, crew.operator):
        client = api_as(user)
        assert client.get(path).json()["url"] == masked
        [listed] = client.get("/api/v1/notifiers/").json()["results"]
        assert listed["url"] == masked
    assert api_as(crew.admin).get(path).json()["url"] == PUBLIC_URL

    page = Client()
    page.force_login(crew.viewer)
    text = page.get("/alerts/notifiers/").content.decode()
    assert SECRET not in text and "s3cret" not in text and masked in text
    page.force_login(crew.admin)
    assert SECRET in page.get("/alerts/notifiers/").content.decode()


def test_an_edit_without_the_url_or_with_its_masked_form_keeps_it(crew: Crew) -> None:
    notifier = webhook(PUBLIC_URL, crew.team)
    admin, path = api_as(crew.admin), f"/api/v1/notifiers/{notifier.pk}/"
    assert admin.patch(path, {"enabled": False}, format="json").status_code == 200
    assert admin.put(path, {"name": "ops", "kind": "webhook", "min_severity": "warning"},
                     format="json").status_code == 200
    assert admin.put(path, {"name": "ops", "kind": "webhook", "url": masked_url(PUBLIC_URL)},
                     format="json").status_code == 200
    assert Notifier.objects.get(pk=notifier.pk).url == PUBLIC_URL


def test_the_audit_log_keeps_webhook_urls_masked(crew: Crew) -> None:
    admin = api_as(crew.admin)
    created = _create(admin, PUBLIC_URL)
    assert created.status_code == 201, created.content
    path = f"/api/v1/notifiers/{created.json()['id']}/"
    other = "https://hooks.example.com/services/T000/B000/another-secret"
    assert admin.patch(path, {"url": other}, format="json").status_code == 200
    assert admin.delete(path).status_code == 204
    entries = list(AuditEntry.objects.filter(object_type="alerts.notifier").order_by("pk"))
    assert [e.action for e in entries] == ["notifier.create", "notifier.edit", "notifier.delete"]
    stored = json.dumps([e.changes for e in entries])
    assert SECRET not in stored and "s3cret" not in stored and "another-secret" not in stored
    before, after = entries[1].changes["url"]
    # Masked, and still an edit the log shows: the tags differ.
    assert before.startswith("https://hooks.example.com/… #")
    assert after.startswith("https://hooks.example.com/… #") and before != after
    # What the team's viewer reads of it.
    listed = api_as(crew.viewer).get("/api/v1/audit/").content.decode()
    assert SECRET not in listed and "another-secret" not in listed


def test_an_admin_of_another_team_sees_nothing_and_a_viewer_cannot_edit(crew: Crew) -> None:
    notifier = webhook(PUBLIC_URL, crew.team)
    path = f"/api/v1/notifiers/{notifier.pk}/"
    stranger_admin = member("sam", Team.objects.create(name="third"), Role.ADMIN)
    assert api_as(stranger_admin).get(path).status_code == 404
    assert api_as(crew.viewer).patch(path, {"url": PUBLIC_URL + "x"},
                                     format="json").status_code == 403


def test_a_serializer_without_a_request_gives_the_masked_url() -> None:
    notifier = webhook(PUBLIC_URL)
    assert NotifierSerializer(notifier).data["url"] == masked_url(PUBLIC_URL)


# ---- the setting -------------------------------------------------------------------------------
def test_the_allowed_networks_setting_is_read_and_a_bad_entry_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(targets.SETTING, "127.0.0.1/32, 10.0.0.0/8,fd00::/8")
    assert env_networks(targets.SETTING) == (ipaddress.ip_network("127.0.0.1/32"),
                                             ipaddress.ip_network("10.0.0.0/8"),
                                             ipaddress.ip_network("fd00::/8"))
    monkeypatch.setenv(targets.SETTING, "")
    assert env_networks(targets.SETTING) == ()
    for bad in ("10.0.0.1/8", "localhost", "10.0.0.0/33"):
        monkeypatch.setenv(targets.SETTING, bad)
        with pytest.raises(ImproperlyConfigured, match=targets.SETTING):
            env_networks(targets.SETTING)
