"""The console's /metrics: every process's last scrape relabelled, for the user's Prometheus."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.deployments.models import Deployment
from console.live.models import MetricSample, ProcessScrape
from console.supervisor.models import ManagedProcess
from tests.console.tokens import token_for

ENGINE = 'engine="0",model_name="smollm2"'



@pytest.fixture
def prometheus(owner: User) -> Client:
    """A scraper with a superuser's token: every deployment's metrics
    (tests/console/test_permissions_live.py holds the export to a team's)."""
    return Client(headers={"Authorization": f"Bearer {token_for(owner, 'prometheus')}"})

def worker_text(running: int, success: int) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{ENGINE}}} {running}.0\n"
        "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        "# TYPE vllm:request_success_total counter\n"
        f'vllm:request_success_total{{{ENGINE},finished_reason="length"}} {success}.0\n'
        "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.\n"
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        f'vllm:e2e_request_latency_seconds_bucket{{{ENGINE},le="1.0"}} {success}.0\n'
        f'vllm:e2e_request_latency_seconds_bucket{{{ENGINE},le="+Inf"}} {success}.0\n'
        f"vllm:e2e_request_latency_seconds_count{{{ENGINE}}} {success}.0\n"
        f"vllm:e2e_request_latency_seconds_sum{{{ENGINE}}} 0.5\n"
    )


def process(deployment: Deployment, slot: str, port: int) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot=slot, role=slot.split("-")[0],
                                         port=port, state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


def families(body: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {family.name: [(s.name, s.labels, s.value) for s in family.samples]
            for family in text_string_to_metric_families(body)}


def test_every_scrape_is_re_exported_with_deployment_and_process_labels(
        prometheus: Client, deployment: Deployment) -> None:
    now = timezone.now()
    prefill = process(deployment, "prefill-0", 8100)
    decode = process(deployment, "decode-0", 8200)
    ProcessScrape.objects.create(process=prefill, scraped=now, text=worker_text(1, 10))
    ProcessScrape.objects.create(process=decode, scraped=now, text=worker_text(4, 7))

    # Prometheus sends an API token, no session.
    response = prometheus.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    # Each family once, with both processes' samples: what Prometheus requires of one target.
    assert body.count("# TYPE vllm:num_requests_running gauge") == 1
    assert body.count("# TYPE vllm:e2e_request_latency_seconds histogram") == 1
    parsed = families(body)
    assert parsed["vllm:num_requests_running"] == [
        ("vllm:num_requests_running", {"deployment": deployment.name, "process": "decode-0",
                                       "engine": "0", "model_name": "smollm2"}, 4.0),
        ("vllm:num_requests_running", {"deployment": deployment.name, "process": "prefill-0",
                                       "engine": "0", "model_name": "smollm2"}, 1.0),
    ]
    success = {labels["process"]: value for name, labels, value in parsed["vllm:request_success"]
               if name == "vllm:request_success_total"}
    assert success == {"prefill-0": 10.0, "decode-0": 7.0}
    buckets = [labels for name, labels, _ in parsed["vllm:e2e_request_latency_seconds"]
               if name.endswith("_bucket")]
    assert {(b["process"], b["le"]) for b in buckets} == {
        ("prefill-0", "1.0"), ("prefill-0", "+Inf"), ("decode-0", "1.0"), ("decode-0", "+Inf")}


def test_a_label_of_the_same_name_is_kept_as_exported(prometheus: Client, deployment: Deployment) -> None:
    router = process(deployment, "router", 8080)
    ProcessScrape.objects.create(process=router, scraped=timezone.now(), text=(
        "# TYPE custom gauge\n"
        'custom{process="engine-core"} 1.0\n'
    ))
    [(_, labels, _)] = families(prometheus.get("/metrics/").content.decode())["custom"]
    assert labels == {"deployment": deployment.name, "process": "router",
                      "exported_process": "engine-core"}


def test_stale_scrapes_are_left_out(prometheus: Client, deployment: Deployment) -> None:
    stopped = process(deployment, "decode-0", 8200)
    ProcessScrape.objects.create(process=stopped, scraped=timezone.now() - timedelta(minutes=5),
                                 text=worker_text(3, 3))
    assert "vllm:num_requests_running" not in families(prometheus.get("/metrics").content.decode())


def test_cpu_and_memory_come_from_the_latest_sample(prometheus: Client, deployment: Deployment) -> None:
    now = timezone.now()
    for age, cpu in ((2, 10.0), (1, 42.5)):
        MetricSample.objects.create(deployment=deployment, resolution="1s",
                                    created=now - timedelta(seconds=age), data={"processes": {
                                        "decode-0": {"role": "decode", "cpu": cpu, "rss": 123_000_000},
                                        "router": {"role": "router", "cpu": None, "rss": None},
                                    }})
    parsed = families(prometheus.get("/metrics").content.decode())
    labels = {"deployment": deployment.name, "process": "decode-0", "role": "decode"}
    assert parsed["pdserve_process_cpu_percent"] == [("pdserve_process_cpu_percent", labels, 42.5)]
    assert parsed["pdserve_process_rss_bytes"] == [("pdserve_process_rss_bytes", labels, 123e6)]


def test_an_empty_console_answers_an_empty_but_valid_page(prometheus: Client, db: None) -> None:
    response = prometheus.get("/metrics")
    assert response.status_code == 200
    assert set(families(response.content.decode())) == {"pdserve_process_cpu_percent",
                                                         "pdserve_process_rss_bytes"}
