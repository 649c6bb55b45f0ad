"""The collector's arithmetic on literal scrapes, written the way vLLM 0.32 and the router write them."""

from __future__ import annotations

import math

import pytest

from inference.prom_snapshot import histogram_quantile, parse, process_stats, router_stats, worker_stats

ENGINE = 'engine="0",model_name="smollm2"'
TTFT_BOUNDS = ("0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
               "0.75", "1.0", "2.5", "+Inf")


def histogram(name: str, labels: str, counts: dict[str, int], total_sum: float,
              bounds: tuple[str, ...] = TTFT_BOUNDS, header: bool = True) -> str:
    """Cumulative bucket lines; ``counts`` gives observations per bucket (not cumulative)."""
    lines = [f"# HELP {name} h", f"# TYPE {name} histogram"] if header else []
    prefix, running = f"{labels}," if labels else "", 0
    for bound in bounds:
        running += counts.get(bound, 0)
        lines.append(f'{name}_bucket{{{prefix}le="{bound}"}} {float(running)}')
    lines.append(f"{name}_count{{{labels}}} {float(running)}")
    lines.append(f"{name}_sum{{{labels}}} {total_sum}")
    return "\n".join(lines)


def vllm_scrape(*, running: int = 0, waiting: int = 0, kv: float = 0.0, prompt: int = 0,
                generation: int = 0, success: int = 0, ttft: dict[str, int] | None = None,
                tpot: dict[str, int] | None = None, itl: dict[str, int] | None = None,
                nixl: tuple[dict[str, int], float, int] | None = None) -> str:
    parts = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{ENGINE}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{ENGINE}}} {float(waiting)}",
        "# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.",
        "# TYPE vllm:num_requests_waiting_by_reason gauge",
        f'vllm:num_requests_waiting_by_reason{{{ENGINE},reason="capacity"}} {float(waiting)}',
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{ENGINE}}} {kv}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{ENGINE}}} {float(prompt)}",
        f"vllm:prompt_tokens_created{{{ENGINE}}} 1.7e+09",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{ENGINE}}} {float(generation)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{ENGINE},finished_reason="stop"}} {float(success)}',
        f'vllm:request_success_total{{{ENGINE},finished_reason="length"}} 0.0',
        histogram("vllm:time_to_first_token_seconds", ENGINE, ttft or {}, 0.0),
        histogram("vllm:e2e_request_latency_seconds", ENGINE, {"0.5": 99}, 9.0),
    ]
    if tpot is not None:
        parts.append(histogram("vllm:request_time_per_output_token_seconds", ENGINE, tpot, 0.0))
    parts.append(histogram("vllm:inter_token_latency_seconds", ENGINE, itl or {}, 0.0))
    if nixl is not None:
        xfer, byte_sum, failed = nixl
        parts.append(histogram("vllm:nixl_xfer_time_seconds", ENGINE, xfer, 0.0,
                               ("0.005", "0.01", "0.025", "0.05", "0.1", "1.0", "+Inf")))
        parts.append(histogram("vllm:nixl_bytes_transferred", ENGINE, {"+Inf": 1}, byte_sum,
                               ("8192.0", "+Inf")))
        parts += ["# HELP vllm:nixl_num_failed_transfers_total Number of failed NIXL KV Cache transfers.",
                  "# TYPE vllm:nixl_num_failed_transfers_total counter",
                  f"vllm:nixl_num_failed_transfers_total{{{ENGINE}}} {float(failed)}"]
    return "\n".join(parts) + "\n"


ROUTER_BOUNDS = ("0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0",
                 "2.5", "5.0", "10.0", "30.0", "60.0", "+Inf")
P, D = "http://127.0.0.1:8100", "http://127.0.0.1:8200"


def router_scrape(*, ok: int = 0, unavailable: int = 0, chat_first_byte: dict[str, int] | None = None,
                  completions_first_byte: dict[str, int] | None = None,
                  prefill: dict[str, int] | None = None, in_flight: tuple[int, int] = (0, 0),
                  fallbacks: int = 0, connect_errors: int = 0,
                  handoffs: tuple[int, int] | None = None) -> str:
    parts = [
        "# HELP pdserve_router_requests_total Requests answered, by endpoint and HTTP status",
        "# TYPE pdserve_router_requests_total counter",
        f'pdserve_router_requests_total{{endpoint="chat",status="200"}} {float(ok)}',
    ]
    if unavailable:
        parts.append(f'pdserve_router_requests_total{{endpoint="completions",status="503"}} '
                     f"{float(unavailable)}")
    parts += [
        histogram("pdserve_router_prefill_seconds", "", prefill or {}, 0.0, ROUTER_BOUNDS),
        histogram("pdserve_router_first_byte_seconds", 'endpoint="chat"', chat_first_byte or {}, 0.0,
                  ROUTER_BOUNDS),
        histogram("pdserve_router_first_byte_seconds", 'endpoint="completions"',
                  completions_first_byte or {}, 0.0, ROUTER_BOUNDS, header=False),
        "# HELP pdserve_router_in_flight Requests in flight per backend",
        "# TYPE pdserve_router_in_flight gauge",
        f'pdserve_router_in_flight{{backend="{P}",role="prefill"}} {float(in_flight[0])}',
        f'pdserve_router_in_flight{{backend="{D}",role="decode"}} {float(in_flight[1])}',
        "# HELP pdserve_router_pd_fallback_total Requests decoded without prefilled KV, by reason",
        "# TYPE pdserve_router_pd_fallback_total counter",
        f'pdserve_router_pd_fallback_total{{reason="token_mismatch"}} {float(fallbacks)}',
        "# HELP pdserve_router_backend_errors_total Failed calls to a backend, by role and kind",
        "# TYPE pdserve_router_backend_errors_total counter",
        f'pdserve_router_backend_errors_total{{kind="ClientConnectorError",role="decode"}} '
        f"{float(connect_errors)}",
    ]
    if handoffs is not None:
        parts += [
            "# HELP pdserve_router_kv_handoffs_total KV hand-offs per prefill and decode worker",
            "# TYPE pdserve_router_kv_handoffs_total counter",
            f'pdserve_router_kv_handoffs_total{{decode="{D}",outcome="ok",prefill="{P}"}} '
            f"{float(handoffs[0])}",
            f'pdserve_router_kv_handoffs_total{{decode="{D}",outcome="failed",prefill="{P}"}} '
            f"{float(handoffs[1])}",
        ]
    return "\n".join(parts) + "\n"


# ---- histogram_quantile ------------------------------------------------------------------------


def test_quantile_interpolates_inside_the_bucket_holding_the_rank() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.195)


def test_quantile_starts_the_lowest_bucket_at_zero() -> None:
    assert histogram_quantile(0.5, [(1.0, 4.0), (math.inf, 4.0)]) == pytest.approx(0.5)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert histogram_quantile(0.95, [(0.1, 0.0), (0.2, 1.0), (math.inf, 10.0)]) == 0.2


def test_quantile_of_no_observations_is_none() -> None:
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(0.1, 3.0), (0.2, 5.0)]) is None  # no +Inf bucket


# ---- vLLM workers --------------------------------------------------------------------------------


def test_first_scrape_has_gauges_but_no_rates_or_quantiles() -> None:
    stats = worker_stats(None, parse(vllm_scrape(running=3, waiting=2, kv=0.125, prompt=50), at=10.0))
    assert stats["running"] == 3
    assert stats["waiting"] == 2  # not added up with num_requests_waiting_by_reason
    assert stats["kv_usage"] == 0.125
    for key in ("prompt_tps", "gen_tps", "rps", "ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95"):
        assert stats[key] is None, key
    assert "nixl_bytes_ps" not in stats


def test_rates_and_quantiles_cover_only_the_interval() -> None:
    # 100 old requests were fast; the 20 in this interval took 0.5-0.75 s to the first token.
    before = parse(vllm_scrape(prompt=1000, generation=400, success=100, ttft={"0.01": 100},
                               tpot={"0.01": 100}), at=10.0)
    after = parse(vllm_scrape(running=1, prompt=1400, generation=500, success=120,
                              ttft={"0.01": 100, "0.75": 20}, tpot={"0.01": 100, "0.1": 20}),
                  at=12.0)
    stats = worker_stats(before, after)
    assert stats["prompt_tps"] == 200.0
    assert stats["gen_tps"] == 50.0
    assert stats["rps"] == 10.0
    # rank 10 of 20 in (0.5, 0.75]: 0.5 + 0.25 * 10 / 20
    assert stats["ttft_p50"] == pytest.approx(0.625)
    assert stats["ttft_p95"] == pytest.approx(0.5 + 0.25 * 19 / 20)
    assert stats["tpot_p50"] == pytest.approx(0.08 + 0.02 * 10 / 20)


def test_no_new_observations_give_none_not_zero() -> None:
    before = parse(vllm_scrape(ttft={"0.01": 5}, tpot={"0.01": 5}), at=1.0)
    after = parse(vllm_scrape(ttft={"0.01": 5}, tpot={"0.01": 5}), at=2.0)
    stats = worker_stats(before, after)
    assert stats["ttft_p50"] is None
    assert stats["tpot_p95"] is None
    assert stats["rps"] == 0.0


def test_a_restarted_worker_counts_from_zero() -> None:
    before = parse(vllm_scrape(generation=5000, success=100, ttft={"0.01": 100}), at=1.0)
    after = parse(vllm_scrape(generation=30, success=2, ttft={"0.25": 2}), at=2.0)
    stats = worker_stats(before, after)
    assert stats["gen_tps"] == 30.0
    assert stats["rps"] == 2.0
    assert 0.1 < stats["ttft_p50"] <= 0.25


def test_tpot_falls_back_to_inter_token_latency() -> None:
    before = parse(vllm_scrape(itl={"0.04": 10}), at=1.0)
    after = parse(vllm_scrape(itl={"0.04": 10, "0.1": 4}), at=2.0)
    stats = worker_stats(before, after)
    assert 0.08 < stats["tpot_p50"] <= 0.1


def test_nixl_transfer_time_bytes_and_failures() -> None:
    before = parse(vllm_scrape(nixl=({"0.01": 4}, 40_000.0, 1)), at=1.0)
    after = parse(vllm_scrape(nixl=({"0.01": 4, "0.05": 2}, 140_000.0, 3)), at=3.0)
    stats = worker_stats(before, after)
    assert 0.025 < stats["nixl_xfer_p50"] <= 0.05
    assert stats["nixl_bytes_ps"] == 50_000.0
    assert stats["nixl_failed_ps"] == 1.0


def test_parse_keeps_only_the_samples_the_snapshot_uses() -> None:
    scrape = parse(vllm_scrape(), at=0.0)
    assert "vllm:e2e_request_latency_seconds_bucket" not in scrape.samples
    assert "vllm:prompt_tokens_created" not in scrape.samples
    assert scrape.sum("vllm:prompt_tokens_total") == 0.0


# ---- the router ----------------------------------------------------------------------------------


def test_router_rates_latencies_and_in_flight() -> None:
    before = parse(router_scrape(ok=10, chat_first_byte={"0.05": 10}, prefill={"0.025": 10}), at=5.0)
    after = parse(router_scrape(ok=14, unavailable=2, chat_first_byte={"0.05": 10, "0.5": 2},
                                completions_first_byte={"0.5": 2}, prefill={"0.025": 10, "0.1": 4},
                                in_flight=(1, 3), fallbacks=1, connect_errors=2), at=7.0)
    stats = router_stats(before, after)
    assert stats["rps_by_status"] == {"200": 2.0, "503": 1.0}
    assert stats["rps"] == 3.0
    # Both endpoints' new observations (4, all in (0.25, 0.5]) are pooled.
    assert stats["ttft_p50"] == pytest.approx(0.375)
    assert stats["handoff_p50"] == pytest.approx(0.05 + 0.05 * 2 / 4)
    assert stats["handoff_p95"] == pytest.approx(0.05 + 0.05 * 3.8 / 4)
    assert stats["in_flight"] == {"prefill": {P: 1}, "decode": {D: 3}}
    assert stats["fallback_ps"] == 0.5
    assert stats["backend_errors_ps"] == {"decode ClientConnectorError": 1.0}
    assert "handoffs" not in stats  # the router of this build has no per-pair counter
    assert stats["kv_handoff_p95"] is None  # nor the hand-off's own histogram


def test_the_hand_off_alone_is_its_own_quantile() -> None:
    def scrape(buckets: dict[str, int]) -> str:
        return router_scrape(ok=1, prefill={"0.5": 4}) + histogram(
            "pdserve_router_kv_handoff_seconds", "", buckets, 0.0, ROUTER_BOUNDS)

    stats = router_stats(parse(scrape({"0.025": 2}), at=1.0),
                         parse(scrape({"0.025": 2, "0.1": 4}), at=2.0))
    assert stats["kv_handoff_p95"] == pytest.approx(0.05 + 0.05 * 3.8 / 4)


def test_router_handoff_pairs() -> None:
    before = parse(router_scrape(handoffs=(5, 1)), at=1.0)
    after = parse(router_scrape(handoffs=(7, 2)), at=2.0)
    assert router_stats(before, after)["handoffs"] == [
        {"prefill": P, "decode": D, "ok": 7, "failed": 2, "failed_now": 1},
    ]
    assert router_stats(None, after)["handoffs"][0]["failed_now"] == 0


def test_process_stats_picks_the_router_by_role() -> None:
    scrape = parse(router_scrape(), at=0.0)
    assert "in_flight" in process_stats("router", None, scrape)
    assert "kv_usage" in process_stats("decode", None, parse(vllm_scrape(), at=0.0))
