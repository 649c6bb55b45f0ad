"""How long a router process takes to answer, and how much memory it holds, with torch and
without it (``inference.router.prompts.without_torch``).

Starts ``python -m inference.router`` in front of a port where nothing listens (its /health
answers 503 once it is up, tokenizer loaded) and times it from spawn to its first answer, then
reads its resident memory. ``with-torch`` is the router as it was before that change: the same
``main`` with ``without_torch`` made a no-op, so transformers imports torch as it does wherever
torch is installed. The two variants alternate, ``--rounds`` times each.

    .venv/bin/python bench/router_start.py --tokenizer data/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
WITH_TORCH = ("import sys; import inference.router.server as server; "
              "server.without_torch = lambda: None; sys.exit(server.main(sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_once(variant: str, tokenizer: str) -> tuple[float, float]:
    """Seconds from spawn to the first answer of /health, and the resident MiB then."""
    port = free_port()
    args = ["--served-model-name", "m", "--tokenizer", tokenizer, "--max-model-len", "2048",
            "--port", str(port), "--colocated", f"http://127.0.0.1:{free_port()}"]
    head = ["-m", "inference.router"] if variant == "without-torch" else ["-c", WITH_TORCH]
    began = time.monotonic()
    router = subprocess.Popen([sys.executable, *head, *args], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if router.poll() is not None:
                raise SystemExit(f"{variant}: the router exited with {router.returncode}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        elapsed = time.monotonic() - began
        rss = psutil.Process(router.pid).memory_info().rss / 2**20
        return elapsed, rss
    finally:
        router.kill()
        router.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="a model directory with a tokenizer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not (Path(args.tokenizer) / "tokenizer_config.json").is_file():
        parser.error(f"--tokenizer: no tokenizer_config.json in {args.tokenizer}")
    results: dict[str, list[tuple[float, float]]] = {"with-torch": [], "without-torch": []}
    for _ in range(args.rounds):
        for variant, runs in results.items():
            runs.append(start_once(variant, args.tokenizer))
    print("| router | start to first answer, s (each round) | median s | resident MiB (median) |")
    print("|---|---|---|---|")
    for variant, runs in results.items():
        times = [t for t, _ in runs]
        print(f"| {variant} | {', '.join(f'{t:.2f}' for t in times)} | "
              f"{statistics.median(times):.2f} | {statistics.median(r for _, r in runs):.0f} |")


if __name__ == "__main__":
    main()
