"""The webhook notifier: Alertmanager's version 4 JSON, POSTed, so its receivers work unchanged.

httpx's timeouts bound each phase (connect, every read), so a receiver that trickles its answer
a byte at a time would never time out; ``asyncio.wait_for`` bounds the whole request instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from console.alerts.models import Notifier
from console.alerts.notifiers.sender import Sender, SendResult

# How much of a refusing receiver's answer the attempt log keeps.
BODY_EXCERPT = 300


class WebhookSender(Sender):
    def send(self, payload: dict[str, Any], notifier: Notifier) -> SendResult:
        try:
            response = asyncio.run(asyncio.wait_for(_post(notifier.url, payload),
                                                    notifier.timeout_s))
        except TimeoutError:
            return SendResult(ok=False, error=f"no answer within {notifier.timeout_s:g} s")
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return SendResult(ok=False, error=f"{type(exc).__name__}: {exc}")
        if response.is_success:
            return SendResult(ok=True, status_code=response.status_code)
        body = response.text.strip()[:BODY_EXCERPT]
        return SendResult(ok=False, status_code=response.status_code,
                          error=f"HTTP {response.status_code} {response.reason_phrase}"
                                + (f": {body}" if body else ""))


async def _post(url: str, payload: dict[str, Any]) -> httpx.Response:
    # No timeout of httpx's own: wait_for is the one bound, whatever the phase.
    async with httpx.AsyncClient(timeout=None) as client:
        return await client.post(url, json=payload, headers={"User-Agent": "pdserve-alerts"})
