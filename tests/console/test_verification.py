"""The verification report (console/verification/) against stand-ins on real sockets: two
workers that answer /health and /v1/models (with their key), and a router that answers /health,
its admin backend list, completions (plain, greedy with token ids, streamed) and streamed chat,
and writes a timeline line per request to its log file as the real one does.

A healthy deployment passes and is stored with its revision; a slower decode is marked as a
regression against the previous report; a closed port, a failing /health and an OOM line fail
with their evidence; the API's shapes, the HTML export's self-containment and the command's
output and exit status."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.accounts.models import Membership, Role, Team
from console.audit.models import AuditEntry
from console.deployments.models import Deployment
from console.fleet.services import local_node
from console.live.models import LogLine, MetricSample
from console.quality import services as gates
from console.quality.models import GateResult
from console.rollouts.models import Revision
from console.supervisor.models import ManagedProcess
from console.supervisor.worker_keys import deployment_worker_key
from console.verification import services
from console.verification.connectivity import connectivity
from console.verification.execution import run_report
from console.verification.html_export import render_report
from console.verification.log_scan import classify
from console.verification.models import VerificationReport
from console.verification.streaming import Outcome, summarise
from console.verification.subject import subject_of
from inference.output_gate import DEFAULT_MAX_TOKENS, ReferenceAnswer, load_prompts
from inference.reference_cache import ReferenceAnswers
from inference.router.asked_placement import PLACEMENT_HEADER
from tests.console.sockets import free_port
from tests.json_handler import JsonHandler

pytestmark = pytest.mark.django_db

GIB = 1 << 30
ANSWER_IDS = list(range(5, 5 + DEFAULT_MAX_TOKENS))
FAST = {"budget_s": 60, "run_options": services.options(lengths=2, concurrencies=1, stress_s=1)}


class WorkerStandIn(ThreadingHTTPServer):
    def __init__(self, port: int, key: str, model: str) -> None:
        self.key, self.model, self.health = key, model, 200
        super().__init__(("127.0.0.1", port), _WorkerHandler)


class _WorkerHandler(JsonHandler):
    server: WorkerStandIn

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self.send_bytes(self.server.health, b"")
        elif self.headers.get("Authorization") != f"Bearer {self.server.key}":
            self.send_json(401, {"error": "no key"})
        elif self.path == "/v1/models":
            self.send_json(200, {"data": [{"id": self.server.model}]})
        else:
            self.send_json(404, {})


class RouterStandIn(ThreadingHTTPServer):
    """The router: ``token_s`` between streamed tokens (a slower decode raises it). As
    pd_adaptive does on a fast processor and a small model, it prefills on decode (no prefill in
    the timeline) every prompt of up to ``local_max_tokens`` tokens (a word counts as a token),
    unless the request names its placement (X-Pdserve-Placement)."""

    def __init__(self, port: int, prefill: str, decode: str, log: Path) -> None:
        self.prefill, self.decode, self.log = prefill, decode, log
        self.token_s = 0.001
        self.local_max_tokens = 5911  # what the borrowed tiny deployment's router reached
        self.placements: list[str | None] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _RouterHandler)

    def timeline(self, request_id: str, tokens: int, placement: str | None) -> None:
        local = placement == "local" or (placement is None and tokens <= self.local_max_tokens)
        line = json.dumps({"request_id": request_id, "prefill": None if local else self.prefill,
                           "decode": self.decode, "status": 200})
        with self.lock, self.log.open("a") as out:
            out.write(f"2026-12-04 INFO pdserve.router timeline {line}\n")


class _RouterHandler(JsonHandler):
    server: RouterStandIn
    protocol_version = "HTTP/1.0"  # a streamed body ends when the connection closes
    # Each token its own TCP segment, as a real server's stream: Nagle would bunch them.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self.send_json(200, {"status": "ok", "mode": "pd", "roles": {
                "prefill": {"ready": 1}, "decode": {"ready": 1}}})
        elif self.path == "/admin/backends":
            self.send_json(200, {"mode": "pd", "roles": {
                role: {"policy": "round_robin", "backends": [
                    {"role": role, "url": url, "state": "ready", "revision": "1"}]}
                for role, url in (("prefill", self.server.prefill),
                                  ("decode", self.server.decode))}})
        else:
            self.send_json(404, {})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        words = len(str(body.get("prompt") or body.get("messages")).split())
        placement = self.headers.get(PLACEMENT_HEADER)
        self.server.placements.append(placement)
        self.server.timeline(self.headers.get("X-Request-Id", "anonymous"), words, placement)
        tokens = int(body.get("max_tokens") or 8)
        chat = self.path == "/v1/chat/completions"
        if not body.get("stream"):
            self.send_json(200, {"choices": [{"text": " Paris.", "finish_reason": "length",
                                              "token_ids": ANSWER_IDS[:tokens]}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": tokens}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        prompt = len(str(body.get("prompt") or body.get("messages")).split())
        for n in range(tokens):
            time.sleep(self.server.token_s)
            finish = "length" if n == tokens - 1 else None
            choice = ({"index": 0, "delta": {"content": " blue"}, "finish_reason": finish} if chat
                      else {"index": 0, "text": " blue", "finish_reason": finish})
            self._event({"choices": [choice]})
        self._event({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": tokens}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, message: dict[str, Any]) -> None:
        self.wfile.write(f"data: {json.dumps(message)}\n\n".encode())
        self.wfile.flush()


def _serve(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


class Stack:
    def __init__(self, deployment: Deployment, tmp_path: Path) -> None:
        self.deployment = deployment
        ports = {"router": free_port(), "prefill-0": free_port(), "decode-0": free_port()}
        Deployment.objects.filter(pk=deployment.pk).update(
            router_port=ports["router"], desired_state=Deployment.DesiredState.RUNNING,
            concurrency=2)
        for worker in deployment.workers.all():
            worker.port = ports[worker.slot]
            worker.save(update_fields=["port"])
        node = local_node()
        type(node).objects.filter(pk=node.pk).update(memory_bytes=16 * GIB)
        deployment.refresh_from_db()
        key = deployment_worker_key(deployment.name)
        self.workers = {slot: WorkerStandIn(ports[slot], key, deployment.served_model_name)
                        for slot in ("prefill-0", "decode-0")}
        self.log = tmp_path / "router.log"
        self.router = RouterStandIn(ports["router"], f"http://127.0.0.1:{ports['prefill-0']}",
                                    f"http://127.0.0.1:{ports['decode-0']}", self.log)
        for server in (*self.workers.values(), self.router):
            _serve(server)
        started = timezone.now() - timedelta(hours=1)
        self.rows = {slot: ManagedProcess.objects.create(
            deployment=deployment, slot=slot, role=slot.split("-")[0], port=ports[slot],
            kind=ManagedProcess.Kind.ROUTER if slot == "router" else ManagedProcess.Kind.WORKER,
            state=ManagedProcess.State.READY, pid=1, log_path=str(tmp_path / f"{slot}.log"),
            started_at=started) for slot in ports}
        self.rows["router"].log_path = str(self.log)
        self.rows["router"].save(update_fields=["log_path"])
        # What the supervisor's collector writes each second during a run, stamped ahead so
        # that every phase's window ("from its start on") holds them.
        ahead = timezone.now() + timedelta(minutes=10)
        for n in range(3):
            MetricSample.objects.create(
                deployment=deployment, resolution=MetricSample.Resolution.SECOND,
                created=ahead + timedelta(seconds=n), data={"processes": {
                    slot: {"up": 1, "cpu": 50.0, "rss": 600 * (1 << 20), "kv_usage": 0.1,
                           "running": 1, "waiting": 0} for slot in ("prefill-0", "decode-0")}})

    def close(self) -> None:
        for server in (*self.workers.values(), self.router):
            server.shutdown()
            server.server_close()


@pytest.fixture
def stack(deployment: Deployment, tmp_path: Path, settings: Any) -> Iterator[Stack]:
    settings.PDSERVE_CACHE_DIR = tmp_path / "cache"
    built = Stack(deployment, tmp_path)
    yield built
    built.close()


def _gate_with_reference(deployment: Deployment) -> GateResult:
    """A finished gate whose reference answers are kept: the greedy check compares with them."""
    gate = GateResult.objects.create(deployment=deployment, trigger="demand", state="passed",
                                     prompts=2, min_agreement=0.9, max_mean_delta=0.5,
                                     action="warn")
    variant = gates.reference_variant(deployment)
    assert variant is not None
    prompts = load_prompts(2)
    ReferenceAnswers(settings.PDSERVE_CACHE_DIR, variant.path, dtype=deployment.dtype,
                     enforce_eager=settings.PDSERVE_ENFORCE_EAGER,
                     max_tokens=DEFAULT_MAX_TOKENS).put(
        prompts, [ReferenceAnswer([1, 2, 3], ANSWER_IDS, [-0.1] * len(ANSWER_IDS))
                  for _ in prompts])
    return gate


def _verify(deployment: Deployment) -> VerificationReport:
    report = services.queue_verification(deployment, VerificationReport.Trigger.COMMAND,
                                         send=False, **FAST)
    return run_report(report.pk)


def _check(report: VerificationReport, section: str, name: str) -> dict[str, Any]:
    found = report.section(section)
    assert found is not None, [s["name"] for s in report.sections]
    return next(c for c in found["checks"] if c["name"] == name)


# ---- the report --------------------------------------------------------------------------------

def test_a_healthy_deployment_passes_and_is_stored_with_its_revision(stack: Stack) -> None:
    deployment = stack.deployment
    Revision.objects.create(deployment=deployment, number=3, spec={}, state="live")
    _gate_with_reference(deployment)
    report = _verify(deployment)

    assert report.state == "done", report.error
    verdicts = {s["name"]: (s["verdict"], s["summary"]) for s in report.sections}
    assert [s["name"] for s in report.sections] == [
        "connectivity", "function", "performance", "stress", "logs", "resources"]
    assert all(v == "pass" for v, _ in verdicts.values()), verdicts
    assert report.verdict == "pass" and report.passing
    assert report.revision == 3
    assert report.comparison == {}  # the first report: nothing to compare with

    pair = _check(report, "connectivity", "every pair served")
    assert pair["evidence"]["served"][0].endswith(f"-> {stack.router.decode}")
    greedy = _check(report, "function", "greedy output")
    assert greedy["evidence"]["agreement"] == 1.0
    performance = report.section("performance")
    assert performance is not None
    points = performance["numbers"]["points"]
    assert [(p["input_words"], p["concurrency"]) for p in points] == [(32, 2), (1016, 2)]
    for point in points:
        assert point["failed"] == 0 and point["completed"] == 4
        assert point["ttft_ms_p50"] > 0 and point["tpot_ms_p50"] >= 1.0
        assert point["itl_ms_p50"] >= 1.0 and point["e2el_ms_p50"] > point["ttft_ms_p50"]
        assert point["output_throughput"] > 0
    stress = report.section("stress")
    assert stress is not None and stress["numbers"]["completed"] > 0
    assert stress["numbers"]["failed"] == 0 and stress["numbers"]["restarts"] == {}
    resources = report.section("resources")
    assert resources is not None
    assert resources["numbers"]["workers"]["decode-0"]["rss_peak_gib"] == pytest.approx(0.586, 0.01)


def test_the_pair_check_names_its_placement_however_much_the_router_keeps_on_decode(
        stack: Stack) -> None:
    """Under pd_adaptive the router prefills on decode what decode computes fast enough: past
    five thousand tokens on a fast processor and the tiny model. The pair check's requests name
    their placement, so each still goes from prefill to decode."""
    subject = subject_of(stack.deployment)
    served = connectivity(stack.deployment, subject, report_id=1)
    pair = next(c for c in served.checks if c.name == "every pair served")
    assert pair.verdict == "pass", pair.detail
    assert stack.router.placements and set(stack.router.placements) == {"remote"}


def test_the_second_report_marks_a_slower_decode_as_a_regression(stack: Stack) -> None:
    first = _verify(stack.deployment)
    assert first.comparison == {}
    stack.router.token_s = 0.03  # decode 30x slower per token
    second = _verify(stack.deployment)

    assert second.comparison["previous"] == first.pk
    regressed = {r["metric"] for r in second.comparison["regressions"] if "metric" in r}
    assert {"tpot_ms_p50", "itl_ms_p50"} <= regressed
    tpot = next(r for r in second.comparison["regressions"] if r.get("metric") == "tpot_ms_p50")
    assert tpot["after"] > tpot["before"] * 1.2 and tpot["after"] - tpot["before"] > 5
    assert second.verdict == "warn" and second.passing
    html = render_report(second)
    assert html.count('class="regression"') == len(second.comparison["regressions"])


def test_a_closed_port_a_failing_health_and_an_oom_line_fail_with_their_evidence(
        stack: Stack) -> None:
    decode = stack.workers["decode-0"]
    decode.shutdown()
    decode.server_close()
    stack.workers["prefill-0"].health = 503
    LogLine.objects.create(process=stack.rows["prefill-0"], seq=7, created=timezone.now(),
                           text="RuntimeError: CPU out of memory allocating KV cache")
    report = _verify(stack.deployment)

    assert report.verdict == "fail" and not report.passing
    port = _check(report, "connectivity", "port decode-0")
    assert port["verdict"] == "fail"
    assert port["evidence"]["port"] == decode.server_address[1]
    assert "Connection" in port["evidence"]["error"]
    health = _check(report, "connectivity", "worker prefill-0")
    assert health["verdict"] == "fail" and health["evidence"]["health_status"] == 503
    oom = _check(report, "logs", "prefill-0 oom")
    assert oom["verdict"] == "fail"
    [line] = oom["evidence"]["lines"]
    assert line["seq"] == 7
    assert line["page"] == f"/processes/{stack.rows['prefill-0'].pk}/log/#seq-7"


def test_the_benchmark_numbers_follow_vllms_definitions() -> None:
    outcomes = [Outcome(ok=True, ttft=0.1, e2el=0.5, itl=[0.2, 0.2], output_tokens=5),
                Outcome(ok=True, ttft=0.3, e2el=0.3, itl=[], output_tokens=1),
                Outcome(error="HTTP 500: boom")]
    numbers = summarise(outcomes, duration=2.0)
    assert numbers["completed"] == 2 and numbers["failed"] == 1
    # TPOT only for requests with more than one output token: (0.5 - 0.1) / 4.
    assert numbers["tpot_ms_p50"] == 100.0
    assert numbers["ttft_ms_p50"] == 200.0  # linear interpolation of 100 and 300
    assert numbers["itl_ms_p99"] == 200.0
    assert numbers["request_throughput"] == 1.0 and numbers["output_throughput"] == 3.0
    assert numbers["errors"] == ["HTTP 500: boom"]


# ---- API, pages, export, command ---------------------------------------------------------------

def _team_user(deployment: Deployment, role: Role) -> User:
    user = User.objects.create_user(username=f"u-{role.value}", password="x")
    team = Team.objects.get(pk=deployment.team_id)
    Membership.objects.create(user=user, team=team, role=role)
    return user


def test_the_api_queues_lists_reads_and_exports(stack: Stack, api: APIClient) -> None:
    deployment = stack.deployment
    url = f"/api/v1/deployments/{deployment.pk}/verifications/"
    queued = api.post(url, {"budget_s": 90, "stress_s": 5, "lengths": 2}, format="json")
    assert queued.status_code == 202, queued.content
    body = queued.json()
    assert body["state"] == "queued" and body["budget_s"] == 90
    assert body["options"] == {"lengths": 2, "concurrencies": 2, "stress_s": 5}
    assert AuditEntry.objects.filter(action="verification.run").count() == 1
    again = api.post(url, {}, format="json")
    assert again.status_code == 409 and "already" in again.json()["detail"]

    run_report(body["id"])
    listed = api.get(url).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]
    detail = api.get(f"/api/v1/verifications/{body['id']}/").json()
    assert detail["state"] == "done" and len(detail["sections"]) == 6
    assert {"name", "verdict", "summary", "numbers", "seconds", "checks"} <= set(detail["sections"][0])

    export = api.get(f"/api/v1/verifications/{body['id']}/export.html")
    assert export.status_code == 200 and export["Content-Type"].startswith("text/html")
    html = export.content.decode()
    assert "<svg" in html and "<style>" in html and "TTFT p50" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.IGNORECASE)
    assert "<script" not in html and "<link" not in html


def test_a_viewer_may_read_but_not_verify(stack: Stack) -> None:
    viewer = _team_user(stack.deployment, Role.VIEWER)
    client = APIClient()
    client.force_authenticate(viewer)
    url = f"/api/v1/deployments/{stack.deployment.pk}/verifications/"
    assert client.post(url, {}, format="json").status_code == 403
    assert client.get(url).status_code == 200
    Deployment.objects.filter(pk=stack.deployment.pk).update(desired_state="stopped")
    operator = APIClient()
    operator.force_authenticate(_team_user(stack.deployment, Role.OPERATOR))
    refused = operator.post(url, {}, format="json")
    assert refused.status_code == 409 and "not running" in refused.json()["detail"]


def test_the_page_button_queues_and_the_report_page_shows_progress(stack: Stack,
                                                                   owner: User) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(f"/deployments/{stack.deployment.name}/")
    assert page.status_code == 200 and b'id="run-verification"' in page.content
    response = client.post(f"/deployments/{stack.deployment.name}/verify/")
    assert response.status_code == 302
    report = VerificationReport.objects.get()
    assert response["Location"] == f"/verifications/{report.pk}/"
    shown = client.get(response["Location"])
    assert shown.status_code == 200 and b"queued" in shown.content
    assert b"data-refresh-url" in shown.content
    # The button queued the default sweep (31 s here against the stand-in workers); what is
    # asserted below is the page, so the run is the smallest sweep the command's test uses.
    VerificationReport.objects.filter(pk=report.pk).update(
        options={**report.options, "lengths": 1, "concurrencies": 1, "stress_s": 1})
    run_report(report.pk)
    panel = client.get(f"/verifications/{report.pk}/panel/").content
    assert b"data-refresh-stop" in panel and b'id="section-performance"' in panel


def test_the_command_prints_each_section_and_fails_with_a_failing_one(
        stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    args = [stack.deployment.name, "--budget-s", "60", "--stress-s", "1", "--lengths", "1",
            "--concurrencies", "1"]
    call_command("verify", *args)
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()
             if line and line.split()[0] in ("connectivity", "function", "performance", "stress",
                                             "logs", "resources")]
    assert names == ["connectivity", "function", "performance", "stress", "logs", "resources"]
    assert "verdict: warn" in out  # no gate result: "no reference" warns, nothing fails

    stack.workers["prefill-0"].health = 503
    with pytest.raises(CommandError, match="failed"):
        call_command("verify", *args)
    out = capsys.readouterr().out
    assert "connectivity  FAIL" in out and "/health answered 503" in out


def test_a_report_whose_job_never_finished_does_not_block_the_next(stack: Stack,
                                                                   api: APIClient) -> None:
    lost = services.queue_verification(stack.deployment, VerificationReport.Trigger.DEMAND,
                                       send=False, budget_s=60)
    VerificationReport.objects.filter(pk=lost.pk).update(
        state=VerificationReport.State.RUNNING,
        created=timezone.now() - timedelta(seconds=60 + services.STALE_AFTER_S + 1))
    queued = api.post(f"/api/v1/deployments/{stack.deployment.pk}/verifications/", {},
                      format="json")
    assert queued.status_code == 202, queued.content
    lost.refresh_from_db()
    assert lost.state == "error" and "never finished" in lost.error


@pytest.mark.parametrize(("line", "kind"), [
    ("ERROR 12-04 10:00:01 [core.py:91] RuntimeError: out of memory", "oom"),
    ("WARNING 12-04 10:00:01 [cpu.py:12] lower max_num_seqs to avoid OOM", "warning"),
    ("ERROR 12-04 10:00:02 [nixl.py:40] NIXL transfer timed out after 30 s", "kv_transfer"),
    ("INFO 12-04 10:00:03 [logger.py:7] KV load failure for request 7, recomputing", "kv_transfer"),
    ("ERROR 12-04 10:00:04 [server.py:3] EngineDeadError", "error"),
    ("INFO 12-04 10:00:05 [api.py:1] 200 OK", None),
    # make up's healthy start: vLLM's configuration dump and pdserve's start header.
    ("(Worker pid=8159) INFO 12-05 17:21:06 [example_connector.py:107] KVTransferConfig("
     "kv_connector='PdserveSharedStorageConnector', kv_role='kv_consumer', "
     "enable_permute_local_kv=False, kv_load_failure_policy='fail')", None),
    ("=== pdserve 2026-12-05T17:19:53+00:00 starting decode-0@r2: python -m vllm "
     '--kv-transfer-config {"kv_connector_extra_config":{},"kv_load_failure_policy":"fail"}',
     None),
])
def test_log_lines_are_told_apart(line: str, kind: str | None) -> None:
    found = classify(line)
    assert (found.name if found else None) == kind
