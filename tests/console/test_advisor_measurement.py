"""The speed measurement task: its vLLM server and its measurement CLI are requested of the
supervisor (stood in for here: nothing is spawned), the CLI's progress lines reach the row while
it runs, and its result becomes the stored speeds; an error line fails the row with its
message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from console.advisor import speed_runs
from console.advisor.models import SpeedProfile
from console.deployments.models import Deployment
from console.supervisor.models import ManagedProcess
from tests.console.test_advisor import SPEEDS
from tests.console.tiny_models import make_plan

PROGRESS = {"event": "progress", "stage": "prefill", "batch": 1, "tokens": 128, "ms": 40.0}


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    return make_plan(tmp_path)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What was asked of the supervisor, after the test's first entry: ``{"lines": [...]}``,
    what the measurement 'prints' into its log."""
    requests: list[dict[str, Any]] = []

    @contextmanager
    def served(server: Any, kind: str, slot: str, log_path: Path) -> Iterator[Any]:
        requests.append({"kind": kind, "slot": slot, "cores": server.cores})
        port = 9 if slot.endswith("-server") else 11
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", kind=kind, slot=slot,
                              deployment_id=None)

    def request(kind: str, slot: str, argv: list[str], env: dict[str, str], log_path: Path,
                port: int | None, role: str) -> ManagedProcess:
        requests.append({"kind": kind, "slot": slot, "argv": argv, "port": port})
        log_path.write_text("\n".join(requests[0]["lines"]) + "\n")
        return ManagedProcess.objects.create(deployment=None, slot=slot, kind=kind, role=role,
                                             command=argv, log_path=str(log_path), exit_code=0,
                                             state=ManagedProcess.State.STOPPED,
                                             started_at=timezone.now(), pid=None)

    monkeypatch.setattr(speed_runs, "served", served)
    monkeypatch.setattr(speed_runs.process_requests, "request", request)
    monkeypatch.setattr(speed_runs.process_requests, "release", lambda row: None)
    return requests


def queued(plan: Deployment) -> SpeedProfile:
    worker = plan.workers.get(role="decode")
    return SpeedProfile.objects.create(node=worker.node, variant=worker.variant)


def test_the_result_is_stored_with_its_progress(plan: Deployment,
                                               asked: list[dict[str, Any]]) -> None:
    profile = queued(plan)
    asked.append({"lines": ["INFO starting", json.dumps(PROGRESS),
                            json.dumps({"event": "result", "speeds": SPEEDS})]})
    done = speed_runs.run(profile.pk)
    assert done.state == SpeedProfile.State.DONE, done.error
    assert done.speeds == SPEEDS and done.progress == [PROGRESS]
    server, neighbour, cli = asked[1], asked[2], asked[3]
    assert server["kind"] == neighbour["kind"] == cli["kind"] == ManagedProcess.Kind.MEASUREMENT
    # One core each, the measured server's and its neighbour's, both of the node.
    node = plan.workers.get(role="decode").node
    assert server["cores"] == (node.cpu_ids[-1],) and neighbour["cores"] == (node.cpu_ids[-2],)
    assert cli["argv"][1:4] == ["-m", "inference.advisor", "measure"]
    assert cli["argv"][cli["argv"].index("--url") + 1] == "http://127.0.0.1:9"
    assert cli["argv"][cli["argv"].index("--neighbour-url") + 1] == "http://127.0.0.1:11"
    assert cli["port"] is None
    # The servers' keys went through files, gone once the run ended.
    for flag in ("--key-file", "--neighbour-key-file"):
        assert not Path(cli["argv"][cli["argv"].index(flag) + 1]).exists()


def test_a_node_of_one_core_is_measured_without_a_neighbour(
        plan: Deployment, asked: list[dict[str, Any]]) -> None:
    node = plan.workers.get(role="decode").node
    node.cpu_ids = node.cpu_ids[:1]
    node.save()
    asked.append({"lines": [json.dumps({"event": "result", "speeds": SPEEDS})]})
    assert speed_runs.run(queued(plan).pk).state == SpeedProfile.State.DONE
    assert [a["slot"].rsplit("-", 1)[-1] for a in asked[1:]] == ["server", "measure"]
    assert "--neighbour-url" not in asked[-1]["argv"]


def test_an_error_line_fails_the_row(plan: Deployment, asked: list[dict[str, Any]]) -> None:
    asked.append({"lines": [json.dumps({"event": "error", "message": "HTTP 500 from the server"})]})
    failed = speed_runs.run(queued(plan).pk)
    assert failed.state == SpeedProfile.State.FAILED
    assert "HTTP 500 from the server" in failed.error


def test_a_run_not_queued_is_left_alone(plan: Deployment, asked: list[dict[str, Any]]) -> None:
    profile = queued(plan)
    SpeedProfile.objects.filter(pk=profile.pk).update(state=SpeedProfile.State.DONE)
    assert speed_runs.run(profile.pk).state == SpeedProfile.State.DONE
    assert asked == []
