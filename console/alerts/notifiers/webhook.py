"""The webhook notifier: Alertmanager's version 4 JSON, POSTed, so its receivers work unchanged.

Every send resolves the receiver's name, checks every address it resolves to (targets.py) and
connects to a checked address, keeping the name in the Host header and as the TLS server name
(SNI, certificate check): a DNS answer that changes between the check and the connection is
never used. Redirects are not followed, environment proxies are not used, and the reply is read
up to ``REPLY_CAP`` bytes and no further.

httpx's timeouts bound each phase (connect, every read), so a receiver that trickles its answer
a byte at a time would never time out; ``asyncio.wait_for`` bounds the whole request instead,
and the name's resolution shares the same deadline.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx

from console.alerts.models import Notifier
from console.alerts.notifiers.sender import Sender, SendResult
from console.alerts.notifiers.targets import Target, TargetRefused, resolve

# The longest a send may take, whatever a notifier row says (the API allows up to this).
MAX_TIMEOUT_S = 60.0
# How much of a reply is read: a receiver answers "ok" or a short reason, not megabytes.
REPLY_CAP = 64 * 1024
# How much of a refusing public receiver's reply the attempt log keeps, sanitized.
EXCERPT = 120
TEXT_TYPES = ("text/", "application/json", "application/problem+json")
HEADERS = {"User-Agent": "pdserve-alerts", "Accept-Encoding": "identity"}


class WebhookSender(Sender):
    def send(self, payload: dict[str, Any], notifier: Notifier) -> SendResult:
        timeout_s = min(notifier.timeout_s, MAX_TIMEOUT_S)
        deadline = time.monotonic() + timeout_s
        try:
            url = httpx.URL(notifier.url)
            targets = _resolve_within(url, timeout_s)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            return asyncio.run(asyncio.wait_for(_post(url, targets, payload), left))
        except TimeoutError:
            return SendResult(ok=False, error=f"no answer within {timeout_s:g} s")
        except TargetRefused as exc:
            return SendResult(ok=False, error=f"refused: {exc}")
        except httpx.InvalidURL as exc:
            return SendResult(ok=False, error=f"not a URL: {exc}")
        except httpx.HTTPError as exc:
            return SendResult(ok=False, error=f"{type(exc).__name__}: {_clean(str(exc), 200)}")


def _resolve_within(url: httpx.URL, timeout_s: float) -> list[Target]:
    """resolve() on a thread of its own, given up after ``timeout_s``: the C resolver's own
    timeouts (5 s a server and attempt) are not the notifier's."""
    if url.scheme not in ("http", "https") or not url.host:
        raise TargetRefused("a webhook's URL is http:// or https:// with a host")
    if url.userinfo:  # a row from before credentials were refused: they are not sent
        raise TargetRefused("credentials in the URL (user:password@) are not accepted")
    port = url.port or (443 if url.scheme == "https" else 80)
    outcome: list[list[Target] | BaseException] = []

    def run() -> None:
        try:
            outcome.append(resolve(url.raw_host.decode("ascii"), port))
        except BaseException as exc:  # handed to the caller as it is
            outcome.append(exc)

    thread = threading.Thread(target=run, name="webhook-resolve", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise TimeoutError
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


async def _post(url: httpx.URL, targets: list[Target], payload: dict[str, Any]) -> SendResult:
    """POST to the first of the checked addresses that accepts a connection."""
    name = url.raw_host.decode("ascii")
    # The name the receiver expects, as the client would send it: the URL's host and port.
    headers = {**HEADERS, "Host": url.netloc.decode("ascii")}
    extensions = {"sni_hostname": name} if url.scheme == "https" else {}
    refused: httpx.ConnectError | None = None
    # No timeout of httpx's own: wait_for is the one bound, whatever the phase. No proxies from
    # the environment: the checked address is the one connected to.
    async with httpx.AsyncClient(timeout=None, follow_redirects=False, trust_env=False) as client:
        for target in targets:
            pinned = url.copy_with(host=str(target.address))
            try:
                async with client.stream("POST", pinned, json=payload, headers=headers,
                                         extensions=extensions) as response:
                    reply = await _read_capped(response)
                    return _result(response, reply, target)
            except httpx.ConnectError as exc:
                refused = exc
    raise refused or httpx.ConnectError("no address to connect to")


async def _read_capped(response: httpx.Response) -> bytes:
    """At most REPLY_CAP bytes of the reply; the rest is never read (the connection closes)."""
    reply = bytearray()
    async for chunk in response.aiter_raw():
        reply += chunk[:REPLY_CAP - len(reply)]
        if len(reply) >= REPLY_CAP:
            break
    return bytes(reply)


def _result(response: httpx.Response, reply: bytes, target: Target) -> SendResult:
    code = response.status_code
    if response.is_success:
        return SendResult(ok=True, status_code=code)
    # The standard phrase: the one the receiver sent is its own text.
    error = f"HTTP {code} {httpx.codes.get_reason_phrase(code)}".rstrip()
    if response.is_redirect:
        return SendResult(ok=False, status_code=code, error=f"{error}: redirects are not followed")
    excerpt = _excerpt(response, reply, target)
    return SendResult(ok=False, status_code=code, error=error + (f": {excerpt}" if excerpt else ""))


def _excerpt(response: httpx.Response, reply: bytes, target: Target) -> str:
    """A short, printable excerpt of a refusing receiver's reply, for the attempt log that
    every team member reads; receivers put their reason there ("invalid_token").

    Only from a receiver at a public address: an address let through by the deployer's allowed
    networks may be any service in those networks, and the log must not become a way to read
    their pages. Only text, uncompressed."""
    if target.allowed_by_setting:
        return ""
    content_type = response.headers.get("Content-Type", "").lower()
    if not content_type.startswith(TEXT_TYPES) and not content_type.endswith("+json"):
        return ""
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        return ""
    return _clean(reply[:EXCERPT * 4].decode("utf-8", errors="replace"), EXCERPT)


def _clean(text: str, limit: int) -> str:
    """``text`` on one line of printable characters, at most ``limit`` of them."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"
