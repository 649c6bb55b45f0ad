"""Latency from a line written by a worker to the same line shown in the browser.

Runs against a console started with `make up`. It sends requests through the router (each
request makes the router write one timeline line when it ends), watches the router's log page
in headless Chromium, and times each line from the moment the client got its answer (the line
is written just before) to the moment the browser's DOM shows it. Same machine, same clock.

    .venv/bin/python bench/live_latency.py --password "$PDSERVE_ADMIN_PASSWORD" --requests 40
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx
from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WATCH = """() => {
  window.seenAt = {};
  new MutationObserver(records => {
    const now = Date.now();
    for (const record of records) for (const node of record.addedNodes) {
      const match = /"request_id":"(lat-[0-9a-f]+)"/.exec(node.textContent || "");
      if (match && !(match[1] in window.seenAt)) window.seenAt[match[1]] = now;
    }
  }).observe(document.getElementById("log"), {childList: true});
}"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = (len(ordered) - 1) * q
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--console", default="http://127.0.0.1:8000")
    parser.add_argument("--router", default="http://127.0.0.1:8080")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", required=True)
    parser.add_argument("--deployment", default="smollm2-1p1d")
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()

    token = httpx.post(f"{args.console}/api/v1/auth/token/",
                       data={"username": args.user, "password": args.password}).json()["token"]
    deployments = httpx.get(f"{args.console}/api/v1/deployments/",
                            headers={"Authorization": f"Token {token}"}).json()["results"]
    deployment = next(d for d in deployments if d["name"] == args.deployment)
    router_process = next(p for p in deployment["processes"] if p["slot"] == "router")

    sent: dict[str, float] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(base_url=args.console)
        page.goto("/login/")
        page.fill("input[name=username]", args.user)
        page.fill("input[name=password]", args.password)
        page.click("button[type=submit]")
        page.goto(f"/processes/{router_process['id']}/log/")
        page.wait_for_function("document.getElementById('log-status').textContent === 'live'")
        page.evaluate(WATCH)
        with httpx.Client(timeout=60) as client:
            for _ in range(args.requests):
                request_id = f"lat-{uuid.uuid4().hex[:12]}"
                client.post(f"{args.router}/v1/completions", headers={"X-Request-Id": request_id},
                            json={"model": "smollm2", "prompt": "Hi", "max_tokens": 1})
                sent[request_id] = time.time() * 1000
                time.sleep(0.25)
        deadline = time.time() + 10
        seen: dict[str, float] = {}
        while time.time() < deadline and len(seen) < len(sent):
            seen = page.evaluate("window.seenAt")
            time.sleep(0.2)
        browser.close()

    latencies = [seen[rid] - at for rid, at in sent.items() if rid in seen]
    print("| lines | shown | p50 ms | p95 ms | max ms |")
    print("|---|---|---|---|---|")
    print(f"| {len(sent)} | {len(latencies)} | {statistics.median(latencies):.0f} | "
          f"{percentile(latencies, 0.95):.0f} | {max(latencies):.0f} |")
    return 0 if len(latencies) == len(sent) else 1


if __name__ == "__main__":
    raise SystemExit(main())
