"""The metrics collector against real supervised processes that serve fixed /metrics texts.

Each child is Python's http.server answering /metrics with the contents of a file the test
rewrites between steps, so counters move exactly as a test says. Nothing here starts vLLM.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.utils import timezone

from console.control.daemon import Supervisor
from console.control.worker_specs import ProcessSpec
from console.deployments.models import Deployment
from console.live.collector import MetricsCollector
from console.live.downsample import MINUTE, merge, prune, roll_up
from console.live.models import MetricSample, ProcessScrape
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port, listening, wait_for

METRICS_SERVER = """
import http.server, pathlib, sys
port, text_file = int(sys.argv[1]), pathlib.Path(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        found = self.path == "/metrics"
        body = text_file.read_bytes() if found else b""
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# Starts a grandchild that burns CPU for a moment, then serves like METRICS_SERVER.
BUSY = "import time\\nend = time.time() + 1.5\\nwhile time.time() < end: pass\\ntime.sleep(300)"
WITH_BUSY_GRANDCHILD = f"""
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "{BUSY}"])
""" + METRICS_SERVER

ENGINE = 'engine="0",model_name="smollm2"'


def vllm_text(*, running: int = 0, waiting: int = 0, kv: float = 0.0, generated: int = 0,
              finished: int = 0, ttft_slow: int = 0) -> str:
    # ttft_slow requests took between 0.5 and 1 s to their first token.
    return "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{ENGINE}}} {running}.0",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{ENGINE}}} {waiting}.0",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{ENGINE}}} {kv}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{ENGINE}}} {generated}.0",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{ENGINE},finished_reason="length"}} {finished}.0',
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{ENGINE},le="0.5"}} 0.0',
        f'vllm:time_to_first_token_seconds_bucket{{{ENGINE},le="1.0"}} {ttft_slow}.0',
        f'vllm:time_to_first_token_seconds_bucket{{{ENGINE},le="+Inf"}} {ttft_slow}.0',
        f"vllm:time_to_first_token_seconds_count{{{ENGINE}}} {ttft_slow}.0",
        f"vllm:time_to_first_token_seconds_sum{{{ENGINE}}} {0.75 * ttft_slow}",
    ]) + "\n"


def router_text(prefill_url: str, decode_url: str, *, ok: int = 0, failed: int = 0,
                errors: int = 0) -> str:
    pair = f'decode="{decode_url}",prefill="{prefill_url}"'
    return "\n".join([
        "# TYPE pdserve_router_requests_total counter",
        f'pdserve_router_requests_total{{endpoint="chat",status="200"}} {ok}.0',
        "# TYPE pdserve_router_in_flight gauge",
        f'pdserve_router_in_flight{{backend="{decode_url}",role="decode"}} 2.0',
        "# TYPE pdserve_router_backend_errors_total counter",
        f'pdserve_router_backend_errors_total{{kind="ClientConnectorError",role="decode"}} {errors}.0',
        "# TYPE pdserve_router_kv_handoffs_total counter",
        f'pdserve_router_kv_handoffs_total{{{pair},outcome="ok"}} {ok}.0',
        f'pdserve_router_kv_handoffs_total{{{pair},outcome="failed"}} {failed}.0',
    ]) + "\n"





@pytest.fixture
def supervisor(db: None, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    leftovers = []
    for child in sup.children.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            leader = psutil.Process(child.popen.pid)
            leftovers += [leader, *leader.children(recursive=True)]
    sup.stop_all(grace_s=1.0)
    for proc in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


@pytest.fixture
def collector(supervisor: Supervisor) -> Iterator[MetricsCollector]:
    # The supervisor's own accessor: exactly what `manage.py supervise` hands the collector.
    # raw_every_s=0: these tests read the raw text back after every collection.
    made = MetricsCollector(supervisor.metric_targets, timeout_s=2.0, raw_every_s=0)
    yield made
    made.http.close()


class Served:
    """A supervised child serving the text in its file."""

    def __init__(self, supervisor: Supervisor, deployment: Deployment, slot: str, text: str,
                 tmp_path: Path, script: str = METRICS_SERVER) -> None:
        self.file = tmp_path / f"{slot}.prom"
        self.file.write_text(text)
        port = free_port()
        spec = ProcessSpec(slot=slot, role=slot.split("-")[0], port=port,
                           argv=[sys.executable, "-c", script, str(port), str(self.file)])
        supervisor._spawn(deployment, spec)
        self.child = supervisor._child_for(deployment.pk, slot)
        assert self.child is not None
        self.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: listening(port) or self.child.popen.poll() is not None, f"{slot} serving")
        assert self.child.popen.poll() is None

    def serve(self, text: str) -> None:
        self.file.write_text(text)


def processes(sample: MetricSample) -> dict[str, Any]:
    return sample.data["processes"]


def test_collect_stores_the_raw_texts_and_one_compact_sample_per_deployment(
        supervisor: Supervisor, collector: MetricsCollector, deployment: Deployment,
        tmp_path: Path) -> None:
    prefill = Served(supervisor, deployment, "prefill-0", vllm_text(), tmp_path)
    decode = Served(supervisor, deployment, "decode-0", vllm_text(), tmp_path)
    router = Served(supervisor, deployment, "router", router_text(prefill.url, decode.url), tmp_path)

    [first] = collector.collect_once()
    assert first.resolution == MetricSample.Resolution.SECOND
    assert set(processes(first)) == {"prefill-0", "decode-0", "router"}
    assert processes(first)["decode-0"]["rps"] is None  # one scrape has no rates yet

    decode.serve(vllm_text(running=3, waiting=1, kv=0.25, generated=200, finished=4, ttft_slow=4))
    router.serve(router_text(prefill.url, decode.url, ok=4))
    time.sleep(0.2)
    [second] = collector.collect_once()

    stats = processes(second)["decode-0"]
    assert stats["role"] == "decode"
    assert stats["up"] == 1
    assert (stats["running"], stats["waiting"], stats["kv_usage"]) == (3, 1, 0.25)
    assert stats["rps"] > 0 and stats["gen_tps"] == pytest.approx(50 * stats["rps"], rel=1e-2)
    assert 0.5 < stats["ttft_p50"] <= 1.0
    assert stats["rss"] > 1_000_000 and stats["cpu"] >= 0.0
    assert processes(second)["router"]["in_flight"] == {"decode": {decode.url: 2}}
    # The console's /metrics re-exports the raw text, kept one row per process.
    decode_row = ManagedProcess.objects.get(deployment=deployment, slot="decode-0")
    assert ProcessScrape.objects.get(process=decode_row).text == decode.file.read_text()
    assert ProcessScrape.objects.count() == 3
    # Only the 1 s samples: a run that crosses a minute boundary also stores a 1 m roll-up.
    assert MetricSample.objects.filter(
        deployment=deployment, resolution=MetricSample.Resolution.SECOND).count() == 2


def test_handoff_pairs_are_named_by_slot_and_remember_their_last_failure(
        supervisor: Supervisor, collector: MetricsCollector, deployment: Deployment,
        tmp_path: Path) -> None:
    prefill = Served(supervisor, deployment, "prefill-0", vllm_text(), tmp_path)
    decode = Served(supervisor, deployment, "decode-0", vllm_text(), tmp_path)
    router = Served(supervisor, deployment, "router", router_text(prefill.url, decode.url, ok=5),
                    tmp_path)
    collector.collect_once()
    router.serve(router_text(prefill.url, decode.url, ok=5, failed=1, errors=1))
    [failed] = collector.collect_once()
    router.serve(router_text(prefill.url, decode.url, ok=6, failed=1, errors=1))
    [later] = collector.collect_once()

    [pair] = processes(later)["router"]["handoffs"]
    assert (pair["prefill_slot"], pair["decode_slot"]) == ("prefill-0", "decode-0")
    assert (pair["ok"], pair["failed"], pair["failed_now"]) == (6, 1, 0)
    # Still shown a second later: the failure happened in the interval that ended at `failed`.
    assert pair["last_failure"] == {"at": failed.created.isoformat(),
                                    "error": "decode ClientConnectorError"}


def test_a_process_without_metrics_is_down_but_still_measured(
        supervisor: Supervisor, collector: MetricsCollector, deployment: Deployment) -> None:
    # Listens nowhere, like a vLLM worker still loading its model.
    supervisor._spawn(deployment, ProcessSpec(slot="decode-0", role="decode", port=free_port(),
                                              argv=[sys.executable, "-c", "import time; time.sleep(300)"]))
    [sample] = collector.collect_once()
    entry = processes(sample)["decode-0"]
    assert entry["up"] == 0
    assert entry["rss"] > 1_000_000
    assert "running" not in entry
    assert not ProcessScrape.objects.exists()


def test_a_restarted_process_starts_its_rates_over(supervisor: Supervisor,
                                                   collector: MetricsCollector,
                                                   deployment: Deployment, tmp_path: Path) -> None:
    first = Served(supervisor, deployment, "decode-0", vllm_text(generated=10_000, finished=50), tmp_path)
    collector.collect_once()
    supervisor.stop(first.child, grace_s=2.0)
    first.child.popen.wait(timeout=5)
    supervisor.reap()
    Served(supervisor, deployment, "decode-0", vllm_text(generated=10_000, finished=60), tmp_path)
    [sample] = collector.collect_once()
    # Same counters, but from a new pid: nothing is known about its interval yet.
    assert processes(sample)["decode-0"]["rps"] is None


def test_stopping_children_are_not_scraped(supervisor: Supervisor, collector: MetricsCollector,
                                           deployment: Deployment, tmp_path: Path) -> None:
    served = Served(supervisor, deployment, "decode-0", vllm_text(), tmp_path)
    assert [target.record_id for target in supervisor.metric_targets()] == [served.child.record_id]
    supervisor.stop(served.child, grace_s=5.0)
    assert supervisor.metric_targets() == []
    assert collector.collect_once() == []


def test_cpu_and_memory_cover_the_whole_process_tree(supervisor: Supervisor,
                                                     collector: MetricsCollector,
                                                     deployment: Deployment, tmp_path: Path) -> None:
    served = Served(supervisor, deployment, "prefill-0", vllm_text(), tmp_path,
                    script=WITH_BUSY_GRANDCHILD)
    leader = psutil.Process(served.child.popen.pid)
    wait_for(lambda: len(leader.children()) == 1, "the grandchild")
    collector.collect_once()
    time.sleep(0.5)
    [sample] = collector.collect_once()
    entry = processes(sample)["prefill-0"]
    tree_rss = leader.memory_info().rss + leader.children()[0].memory_info().rss
    # The leader only waits on its socket; the busy grandchild is what uses the CPU.
    assert entry["cpu"] > 10.0
    assert entry["rss"] == pytest.approx(tree_rss, rel=0.2)
    assert entry["rss"] > leader.memory_info().rss


# ---- history: roll-up and retention --------------------------------------------------------------


def store(deployment: Deployment, resolution: str, at: Any, data: dict[str, Any]) -> MetricSample:
    return MetricSample.objects.create(deployment=deployment, resolution=resolution, created=at,
                                       data=data)


def test_merge_averages_numbers_and_keeps_the_latest_of_the_rest() -> None:
    merged = merge([
        {"processes": {"decode-0": {"role": "decode", "rps": 1.0, "ttft_p50": None, "up": 1}}},
        {"processes": {"decode-0": {"role": "decode", "rps": 3.0, "ttft_p50": 0.2, "up": 0},
                       "router": {"handoffs": [{"ok": 1}]}}},
        {"processes": {"router": {"handoffs": [{"ok": 2}]}}},
    ])
    assert merged == {"processes": {
        "decode-0": {"role": "decode", "rps": 2.0, "ttft_p50": 0.2, "up": 0.5},
        "router": {"handoffs": [{"ok": 2}]},
    }}


def test_roll_up_stores_one_sample_per_complete_minute_once(deployment: Deployment) -> None:
    minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=3)
    for second in range(0, 60, 20):
        store(deployment, "1s", minute + timedelta(seconds=second),
              {"processes": {"router": {"rps": second}}})
    store(deployment, "1s", minute + MINUTE + timedelta(seconds=5), {"processes": {"router": {"rps": 100}}})
    now = minute + 2 * MINUTE + timedelta(seconds=1)
    # The minute in progress (minute + 2) is not rolled up.
    assert roll_up(now) == 2
    assert roll_up(now) == 0
    rolled = list(MetricSample.objects.filter(resolution="1m").values_list("created", "data"))
    assert rolled == [(minute, {"processes": {"router": {"rps": 20.0}}}),
                      (minute + MINUTE, {"processes": {"router": {"rps": 100.0}}})]


def test_prune_keeps_15_minutes_of_seconds_and_7_days_of_minutes(deployment: Deployment) -> None:
    now = timezone.now()
    kept = [store(deployment, "1s", now - timedelta(minutes=14), {}).pk,
            store(deployment, "1m", now - timedelta(days=6, hours=23), {}).pk]
    store(deployment, "1s", now - timedelta(minutes=16), {})
    store(deployment, "1m", now - timedelta(days=7, minutes=1), {})
    assert prune(now) == 2
    assert sorted(MetricSample.objects.values_list("pk", flat=True)) == sorted(kept)


def test_maintenance_runs_once_a_minute(collector: MetricsCollector, deployment: Deployment) -> None:
    now = timezone.now().replace(second=10, microsecond=0)
    store(deployment, "1s", now - MINUTE, {"processes": {}})
    assert collector.maintain(now) is True
    assert collector.maintain(now + timedelta(seconds=30)) is False
    assert collector.maintain(now + MINUTE) is True
    assert MetricSample.objects.filter(resolution="1m").count() == 1



def test_raw_texts_are_rewritten_only_every_few_seconds(supervisor: Supervisor, tmp_path: Path,
                                                       deployment: Deployment) -> None:
    decode = Served(supervisor, deployment, "decode-0", vllm_text(), tmp_path)
    made = MetricsCollector(supervisor.metric_targets, timeout_s=2.0, raw_every_s=3600)
    try:
        made.collect_once()
        row = ManagedProcess.objects.get(deployment=deployment, slot="decode-0")
        first = ProcessScrape.objects.get(process=row).text
        decode.serve(vllm_text(running=3))
        made.collect_once()
        assert ProcessScrape.objects.get(process=row).text == first
        # Only the 1 s samples: a run that crosses a minute boundary also stores a 1 m roll-up.
        assert MetricSample.objects.filter(
            deployment=deployment, resolution=MetricSample.Resolution.SECOND).count() == 2
    finally:
        made.http.close()


def gateway_text(deployment: str, *, answered: int, shed: int, waiting: int) -> str:
    return "\n".join([
        "# TYPE pdserve_gateway_requests counter",
        f'pdserve_gateway_requests_total{{deployment="{deployment}",model="m",status="200"}} '
        f"{answered - shed}.0",
        f'pdserve_gateway_requests_total{{deployment="{deployment}",model="m",status="429"}} {shed}.0',
        'pdserve_gateway_requests_total{deployment="other",model="o",status="200"} 99.0',
        "# TYPE pdserve_gateway_shed counter",
        f'pdserve_gateway_shed_total{{band="low",deployment="{deployment}",reason="queue_full"}} '
        f"{shed}.0",
        "# TYPE pdserve_gateway_queue_waiting gauge",
        f'pdserve_gateway_queue_waiting{{band="low",deployment="{deployment}",flow="t"}} {waiting}.0',
    ]) + "\n"


def test_the_gateways_refusals_of_a_deployment_join_its_routers_numbers_and_feed_the_shedding_fact(
        supervisor: Supervisor, collector: MetricsCollector, deployment: Deployment,
        tmp_path: Path) -> None:
    from console.alerts.series import deployment_facts

    prefill = Served(supervisor, deployment, "prefill-0", vllm_text(), tmp_path)
    decode = Served(supervisor, deployment, "decode-0", vllm_text(), tmp_path)
    Served(supervisor, deployment, "router", router_text(prefill.url, decode.url), tmp_path)
    # The gateway is a process of no deployment: a row of its own kind, serving its text.
    text_file = tmp_path / "gateway.prom"
    text_file.write_text(gateway_text(deployment.name, answered=10, shed=0, waiting=0))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", METRICS_SERVER, str(port), str(text_file)])
    try:
        wait_for(lambda: listening(port), "gateway stand-in serving")
        ManagedProcess.objects.create(kind=ManagedProcess.Kind.GATEWAY, slot="gateway",
                                      role="gateway", port=port, pid=server.pid,
                                      state=ManagedProcess.State.READY)
        [first] = collector.collect_once()
        router = processes(first)["router"]
        assert (router["gateway_waiting"], router["gateway_shed_ps"]) == (0, None)
        assert "deployment.gateway_shed_ps" not in deployment_facts(processes(first))

        text_file.write_text(gateway_text(deployment.name, answered=30, shed=8, waiting=5))
        time.sleep(0.5)
        [second] = collector.collect_once()
        router = processes(second)["router"]
        elapsed = (second.created - first.created).total_seconds()
        assert router["gateway_waiting"] == 5
        assert router["gateway_shed_ps"] == pytest.approx(8 / elapsed, rel=0.25)
        assert router["gateway_rps"] == pytest.approx(20 / elapsed, rel=0.25)
        assert deployment_facts(processes(second))["deployment.gateway_shed_ps"] > 0
        # The router's own numbers are still there.
        assert processes(second)["router"]["in_flight"] == {"decode": {decode.url: 2}}
    finally:
        server.kill()
        server.wait()


def test_the_gateway_replicas_numbers_are_added() -> None:
    from console.live import gateway_scrape

    def stats(pid: int, before: str | None, now: str) -> dict[str, dict[str, float | None]]:
        previous = gateway_scrape.parse(before, pid, 0.0) if before is not None else None
        return gateway_scrape.deployment_stats(previous, gateway_scrape.parse(now, pid, 2.0))

    first = stats(1, gateway_text("d", answered=10, shed=0, waiting=0),
                  gateway_text("d", answered=30, shed=4, waiting=2))
    second = stats(2, gateway_text("d", answered=0, shed=0, waiting=0),
                   gateway_text("d", answered=10, shed=2, waiting=3))
    just_started = stats(3, None, gateway_text("d", answered=5, shed=0, waiting=1))
    assert gateway_scrape.summed([first, second, just_started])["d"] == {
        "gateway_waiting": 6, "gateway_rps": 15.0, "gateway_shed_ps": 3.0}
    # Rates no replica knows yet stay unknown.
    assert gateway_scrape.summed([just_started])["d"] == {
        "gateway_waiting": 1, "gateway_rps": None, "gateway_shed_ps": None}
