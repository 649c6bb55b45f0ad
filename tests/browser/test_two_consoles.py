"""Two console web processes on two ports sharing one PostgreSQL database and one Redis
(DATABASE_URL, REDIS_URL) and one secret key, as two hosts of one console would: both serve
pages, the API and websockets; a token or a session made on one is valid on the other; and a
change made through one reaches a browser and websocket clients connected to the other without
a reload, over the Redis channel layer (no console polls rows when REDIS_URL is set).

Each console has a data directory of its own, so nothing else is shared. The database is a
fresh one on 127.0.0.1:5432, dropped after; the channel layer uses a Redis database number that
the module claims (it was empty) and flushes after. The alert is fired the way the supervisor
fires it, by the evaluator in a process of its own (``manage.py shell``), which broadcasts what
it stores itself.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from channels_redis.core import RedisChannelLayer
from playwright.sync_api import Browser, Page, expect
from websockets.sync.client import ClientConnection, connect

from tests.chromium import signed_in
from tests.console.sockets import free_port

REPO = Path(__file__).resolve().parents[2]
POSTGRES = "postgres://postgres@127.0.0.1:5432"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_DATABASES = 16  # Redis's default `databases`
CLAIM_KEY = "pdserve-test-two-consoles"
USERNAME = "two-consoles"
# A throwaway superuser of a throwaway database, on loopback only.
PASSWORD = "one-console-two-processes"
START_TIMEOUT_S = 90
LIVE_S = 15.0  # a message crosses Redis in milliseconds; the margin is for a loaded machine

# A running PD deployment whose decode worker has been restarted (not a first start) and whose
# latest snapshot says decode does not answer: worker down fires at the evaluator's next tick.
FIRE = """
import json
from datetime import timedelta
from pathlib import Path
from django.utils import timezone
from console.alerts.evaluation import Evaluator
from console.alerts.models import Alert
from console.deployments.defaults import ensure_default_deployment
from console.deployments.models import Deployment
from console.live.models import MetricSample
from console.supervisor.models import ManagedProcess

model = Path({model!r})
model.mkdir(exist_ok=True)
deployment, _ = ensure_default_deployment(model_dir=model)
Deployment.objects.filter(pk=deployment.pk).update(desired_state="running")
now = timezone.now()
for slot, role in (("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")):
    ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                  state="ready", ready_at=now - timedelta(minutes=5), restarts=1,
                                  log_path="/dev/null")
def entry(role, up):
    return {{"role": role, "up": up, "cpu": 1.0, "rss": 1 << 20}}
MetricSample.objects.create(deployment=deployment, resolution="1s", created=now,
    data={{"processes": {{"prefill-0": entry("prefill", 1), "decode-0": entry("decode", 0),
                         "router": entry("router", 1)}}}})
report = Evaluator(holder="two-consoles-test").tick(now + timedelta(seconds=1))
assert report.evaluated, report
alert = Alert.objects.get(deployment=deployment, labels__alertname="WorkerDown")
print(json.dumps({{"alert": alert.pk, "state": alert.state, "team": deployment.team.name}}))
"""

# Instrumentation, before any script of the page runs: how many alert sockets are open.
SOCKETS = """
window.__alertSockets = 0;
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    if (String(args[0]).includes("/ws/alerts/")) {
      this.addEventListener("open", () => { window.__alertSockets += 1; });
    }
  }
};
"""


@dataclass(frozen=True)
class Console:
    name: str
    url: str
    env: dict[str, str]
    log: Path

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://", 1)


@dataclass(frozen=True)
class Pair:
    a: Console
    b: Console
    root: Path


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    name = f"pdserve_two_consoles_{secrets.token_hex(6)}"
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
            # FORCE: a console's pooled connection (conn_max_age) may outlive its process's
            # last request for a moment.
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A Redis database number of this module's own: the first whose claim key it could set
    while it held nothing else (other suites use database 0 with key prefixes)."""
    token = secrets.token_hex(8)
    claimed: redis.Redis | None = None
    for number in range(1, REDIS_DATABASES):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
        if client.set(CLAIM_KEY, token, nx=True):
            if client.dbsize() == 1:
                claimed = client
                break
            client.delete(CLAIM_KEY)  # not empty: someone else's data, left as it was
        client.close()
    if claimed is None:
        pytest.fail(f"no empty Redis database among 1-{REDIS_DATABASES - 1} on "
                    f"{REDIS_HOST}:{REDIS_PORT}")
    number = claimed.connection_pool.connection_kwargs["db"]
    try:
        yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
    finally:
        claimed.flushdb()
        claimed.close()


def _env(database_url: str, redis_url: str, secret_key: str, data_dir: Path,
         port: int) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           # The calling shell's console settings are not these consoles'; and Playwright's
           # permission for ORM calls beside its event loop (tests/chromium.py) is the test's.
           if name not in ("PDSERVE_SECRET_KEY_FILE", "DJANGO_ALLOW_ASYNC_UNSAFE")}
    return {**env, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
            "PDSERVE_SECRET_KEY": secret_key, "PDSERVE_DATA_DIR": str(data_dir),
            "PDSERVE_KV_DIR": str(data_dir / "kv"), "PDSERVE_CONSOLE_PORT": str(port),
            "DJANGO_SUPERUSER_USERNAME": USERNAME, "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
            "DJANGO_SUPERUSER_EMAIL": "two-consoles@localhost"}


@contextmanager
def _served(console: Console) -> Iterator[Console]:
    port = console.env["PDSERVE_CONSOLE_PORT"]
    with open(console.log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
             "--port", port, "--log-level", "warning"],
            cwd=REPO, env=console.env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise AssertionError(f"console {console.name} exited with {server.returncode}: "
                                     f"{console.log.read_text()}")
            try:
                if httpx.get(f"{console.url}/login/", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise AssertionError(f"console {console.name} did not answer within "
                                     f"{START_TIMEOUT_S} s: {console.log.read_text()}")
            time.sleep(0.3)
        yield console
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def consoles(database_url: str, redis_url: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("two-consoles")
    secret_key = secrets.token_urlsafe(50)
    made = []
    for name in ("a", "b"):
        data_dir = root / name
        data_dir.mkdir()
        port = free_port()
        made.append(Console(name=name, url=f"http://127.0.0.1:{port}",
                            env=_env(database_url, redis_url, secret_key, data_dir, port),
                            log=root / f"console-{name}.log"))
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=made[0].env,
                   check=True)
    subprocess.run([*manage, "createsuperuser", "--noinput"], cwd=REPO, env=made[0].env,
                   check=True, stdout=subprocess.DEVNULL)
    with ExitStack() as stack:
        a, b = (stack.enter_context(_served(console)) for console in made)
        yield Pair(a=a, b=b, root=root)


@pytest.fixture(scope="module")
def token(consoles: Pair) -> str:
    """An API token made on console A."""
    response = httpx.post(f"{consoles.a.url}/api/v1/auth/token/", timeout=30,
                          json={"username": USERNAME, "password": PASSWORD})
    assert response.status_code in (200, 201), response.text
    return str(response.json()["token"])


@pytest.fixture(scope="module")
def session_id(consoles: Pair) -> str:
    """A session made by signing in on console A's login form."""
    with httpx.Client(base_url=consoles.a.url, timeout=30) as client:
        form = client.get("/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert csrf is not None, form.text
        signed = client.post("/login/", data={"username": USERNAME, "password": PASSWORD,
                                              "csrfmiddlewaretoken": csrf.group(1)})
        assert signed.status_code == 302 and signed.headers["location"] == "/", signed.text
        return str(client.cookies["sessionid"])


def _api(console: Console, token: str, method: str, path: str,
         body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.request(method, f"{console.url}/api/v1/{path}", json=body, timeout=30,
                         headers={"Authorization": f"Token {token}"})


def _shell(console: Console, code: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO,
                          env=console.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@contextmanager
def _socket(console: Console, session: str) -> Iterator[ClientConnection]:
    with connect(f"{console.ws}/ws/alerts/", open_timeout=10,
                 additional_headers={"Cookie": f"sessionid={session}",
                                     "Origin": console.url}) as socket:
        yield socket


def _alert_message(socket: ClientConnection, alert_id: int, **expected: Any) -> dict[str, Any]:
    """The first alerts message on ``socket`` that carries the alert with ``expected``."""
    deadline = time.monotonic() + LIVE_S
    seen = []
    while time.monotonic() < deadline:
        try:
            message = json.loads(socket.recv(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            break
        seen.append(message)
        for alert in message.get("alerts", []):
            if alert["id"] == alert_id and all(alert[k] == v for k, v in expected.items()):
                return dict(alert)
    raise AssertionError(f"no message for alert {alert_id} with {expected} within {LIVE_S} s; "
                         f"received {seen}")


@pytest.fixture
def page_on_b(browser: Browser, consoles: Pair) -> Iterator[Page]:
    with signed_in(browser, consoles.b.url, USERNAME, PASSWORD) as page:
        page.context.add_init_script(SOCKETS)
        page.goto("/alerts/")
        # Only messages sent after the socket joined its team's group arrive.
        page.wait_for_function("window.__alertSockets > 0", timeout=LIVE_S * 1000)
        page.evaluate("window.__notReloaded = true")
        yield page


def test_both_serve_pages_and_the_api_and_share_tokens_and_sessions(
        consoles: Pair, token: str, session_id: str) -> None:
    for console in (consoles.a, consoles.b):
        login = httpx.get(f"{console.url}/login/", timeout=30)
        assert login.status_code == 200
        assert 'name="password"' in login.text
        # Not signed in: the login form, on either.
        anonymous = httpx.get(f"{console.url}/", timeout=30)
        assert anonymous.status_code == 302
        assert anonymous.headers["location"].startswith("/login/")

        # A's token and A's session, on both: one database, one secret key.
        assert _api(console, "not-a-token", "GET", "teams/").status_code == 401
        mine = _api(console, token, "GET", "tokens/")
        assert mine.status_code == 200, mine.text
        assert mine.json()["count"] == 1
        home = httpx.get(f"{console.url}/", cookies={"sessionid": session_id}, timeout=30)
        assert home.status_code == 200, home.text[:500]
        assert "<h1>Deployments</h1>" in home.text
        assert USERNAME in home.text

    # What one stores through the API, the other lists.
    made = _api(consoles.a, token, "POST", "teams/", {"name": "made-on-a"})
    assert made.status_code == 201, made.text
    teams = _api(consoles.b, token, "GET", "teams/")
    assert teams.status_code == 200, teams.text
    assert "made-on-a" in [team["name"] for team in teams.json()["results"]]


def test_changes_through_one_console_reach_the_other_live(
        page_on_b: Page, consoles: Pair, token: str, session_id: str) -> None:
    page = page_on_b
    navigations: list[str] = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)
    expect(page.locator("#alert-empty")).to_be_visible()
    expect(page.locator("#nav-alert-count")).to_have_text("0")

    # Websocket clients on both consoles, signed in by the session made on A, left idle for
    # longer than the layer's blocking receive: they, and the page's, must still be open.
    with _socket(consoles.a, session_id) as on_a, _socket(consoles.b, session_id) as on_b:
        time.sleep(RedisChannelLayer.brpop_timeout + 1)

        # The evaluator fires in a process of its own and broadcasts through Redis: B's page
        # shows it, with the navigation bar's count, though B stored nothing and polls nothing.
        fired = json.loads(_shell(consoles.a, FIRE.format(model=str(consoles.root / "model")))
                           .strip().splitlines()[-1])
        assert fired["state"] == "firing", fired
        alert_id = fired["alert"]
        for socket in (on_a, on_b):
            _alert_message(socket, alert_id, state="firing", acknowledged_by=None)
        row = page.locator(f'#alert-table tbody tr[data-alert-id="{alert_id}"]')
        expect(row).to_contain_text("WorkerDown", timeout=LIVE_S * 1000)
        expect(row).to_contain_text("decode-0")
        expect(page.locator("#nav-alert-count")).to_have_text("1")
        expect(row).not_to_contain_text("acknowledged by")

        # Acknowledged through A's API: the row on B says who, and both consoles' sockets hear.
        acked = _api(consoles.a, token, "POST", f"alerts/{alert_id}/acknowledge/",
                     {"comment": "on it, from A"})
        assert acked.status_code == 200, acked.text
        assert acked.json()["acknowledged_by"] == USERNAME
        for socket in (on_a, on_b):
            _alert_message(socket, alert_id, state="firing", acknowledged_by=USERNAME)
        expect(row).to_contain_text(f"acknowledged by {USERNAME}: on it, from A",
                                    timeout=LIVE_S * 1000)

        # A silence made on A mutes the row on B; expired through B, A's socket hears it.
        now = datetime.now(UTC)
        silence = _api(consoles.a, token, "POST", "silences/", {
            "team": fired["team"], "comment": "decode restarts, from A",
            "matchers": [{"name": "alertname", "op": "=", "value": "WorkerDown"}],
            "starts_at": (now - timedelta(seconds=5)).isoformat(),
            "ends_at": (now + timedelta(hours=1)).isoformat()})
        assert silence.status_code == 201, silence.text
        silence_id = silence.json()["id"]
        _alert_message(on_b, alert_id)
        expect(row).to_contain_text(f"silenced by #{silence_id}", timeout=LIVE_S * 1000)

        expired = _api(consoles.b, token, "POST", f"silences/{silence_id}/expire/")
        assert expired.status_code == 200, expired.text
        assert expired.json()["state"] == "expired"
        _alert_message(on_a, alert_id)
        expect(row).not_to_contain_text("silenced by", timeout=LIVE_S * 1000)

    assert page.evaluate("window.__notReloaded") is True
    assert navigations == []
    # Its one socket stayed open throughout: alerts.js reopens a closed one.
    assert page.evaluate("window.__alertSockets") == 1
    # A reload on B renders what the socket showed.
    page.reload()
    reloaded = page.locator(f'#alert-table tbody tr[data-alert-id="{alert_id}"]')
    expect(reloaded).to_contain_text(f"acknowledged by {USERNAME}: on it, from A")
    expect(reloaded).not_to_contain_text("silenced by")
