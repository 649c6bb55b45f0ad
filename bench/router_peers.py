"""The peers bench/router_overhead.py measures pdserve's router against, and their table.

- sglang-router (PyPI ``sglang-router``, from ``.venv-bench``: ``bash scripts/install-bench.sh``),
  started by the benchmark with ``sglang_argv``;
- a naive proxy, the floor any router is measured against: this file run as
  ``python bench/router_peers.py --port P --backend URL``.

``print_peers`` prints the side-by-side table with issue 26's targets for pdserve against
sglang-router.
"""

from __future__ import annotations

import argparse
import math
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web


def sglang_argv(python: Path, port: int, backend: str, metrics_port: int) -> list[str]:
    """sglang-router in front of one worker, round robin, quiet."""
    return [str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", backend, "--policy", "round_robin",
            "--log-level", "warn",
            # Its metrics listener defaults to 0.0.0.0:29000, taken by any other sglang-router on
            # the box (it then panics at start).
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]


def run_naive_proxy(port: int, backend: str) -> None:
    """The floor any router is measured against, as vLLM's disaggregation proxy examples are
    written: one shared client session, the request body passed on, the answer's bytes streamed
    back as they come."""

    async def open_session(app: web.Application) -> AsyncIterator[None]:
        # No connection cap: the clients' concurrency, not the pool, must set the load.
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                               timeout=aiohttp.ClientTimeout(total=None))
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(request.method, backend + request.path_qs,
                                   data=await request.read(),
                                   headers={"Content-Type": request.content_type}) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/octet-stream")})
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    app = web.Application()
    app.cleanup_ctx.append(open_session)
    app.router.add_route("*", "/{path:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def check_sglang(python: Path) -> None:
    """Exit with what to do when the interpreter given for sglang-router cannot run it."""
    try:
        subprocess.run([str(python), "-c", "import sglang_router.launch_router"], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            f"sglang-router is not importable with {python} ({error}). Install it with "
            f"`bash scripts/install-bench.sh` (creates .venv-bench), or name another interpreter "
            f"with --sglang-python, or leave it out with --peers pdserve naive.") from error


@dataclass
class PeerFigures:
    rps: float
    cpu_ms: float
    added_ttft_p50: float


def peer_figures(latencies: list[dict[str, Any]], rates: list[dict[str, Any]], peer: str,
                 limits: str) -> PeerFigures:
    """The issue's three figures for one colocated setup (nan where that part did not run)."""
    streamed = [r for r in latencies if (r["peer"], r["mode"], r["limits"]) == (peer, "colocated", limits)]
    rate = [r for r in rates if (r["peer"], r["mode"], r["limits"]) == (peer, "colocated", limits)]
    lowest = min(streamed, key=lambda r: r["concurrency"], default=None)
    highest = max(streamed, key=lambda r: r["concurrency"], default=None)
    nan = float("nan")
    return PeerFigures(
        rps=rate[0]["router_rps"] if rate else nan,
        # s per 1k requests is ms per request.
        cpu_ms=highest["router_cpu_s_per_1k"] if highest else nan,
        added_ttft_p50=(lowest["ttft_p50"]["router"] - lowest["ttft_p50"]["direct"]) if lowest else nan)


def print_peers(args: argparse.Namespace, latencies: list[dict[str, Any]],
                rates: list[dict[str, Any]]) -> None:
    """Issue 26 item 7: pdserve against sglang-router, measured in the same run."""
    concurrencies = sorted(args.concurrency)
    rows = [(f"pdserve ({limits})", peer_figures(latencies, rates, "pdserve", limits))
            for limits in dict.fromkeys(r["limits"] for r in rates if r["peer"] == "pdserve")]
    rows += [(peer, peer_figures(latencies, rates, peer, "-"))
             for peer in ("sglang", "naive") if peer in args.peers]
    sglang = peer_figures(latencies, rates, "sglang", "-") if "sglang" in args.peers else None

    def ratio(ours: float, theirs: float) -> float:
        # A short run can see no CPU tick or no completed request on sglang's side.
        return ours / theirs if theirs else float("nan")

    def verdict(value: float, ok: bool, text: str) -> str:
        if math.isnan(value):  # a side of the comparison did not run
            return "n/a"
        return f"{text} {'met' if ok else 'NOT met'}"

    print(f"\nPeers side by side (colocated): req/s non-streamed at {args.throughput_concurrency}"
          f" connections; CPU per streamed request at concurrency {concurrencies[-1]}; added TTFT"
          f" at concurrency {concurrencies[0]}. Targets for pdserve against sglang-router: req/s"
          f" >= 0.9x, CPU <= 1.5x, TTFT p50 <= +2 ms.\n")
    print("| peer | router req/s | router CPU ms / streamed req | added TTFT p50 ms"
          " | req/s vs sglang (>= 0.9x) | CPU vs sglang (<= 1.5x) | TTFT p50 vs sglang (<= +2 ms) |")
    print("|---|---|---|---|---|---|---|")
    for name, f in rows:
        cells = ["-", "-", "-"]
        if sglang is not None and name.startswith("pdserve"):
            rps, cpu = ratio(f.rps, sglang.rps), ratio(f.cpu_ms, sglang.cpu_ms)
            ttft = f.added_ttft_p50 - sglang.added_ttft_p50
            cells = [verdict(rps, rps >= 0.9, f"{rps:.2f}x"), verdict(cpu, cpu <= 1.5, f"{cpu:.2f}x"),
                     verdict(ttft, ttft <= 2.0, f"{ttft:+.2f} ms")]
        print(f"| {name} | {f.rps:,.0f} | {f.cpu_ms:.2f} | {f.added_ttft_p50:.2f} | {' | '.join(cells)} |")


def main() -> int:
    parser = argparse.ArgumentParser(description="the naive proxy peer (bench/router_overhead.py "
                                                 "starts it)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="the stub's base URL")
    args = parser.parse_args()
    run_naive_proxy(args.port, args.backend)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
