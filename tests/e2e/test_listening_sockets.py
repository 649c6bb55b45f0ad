"""Nothing the borrowed deployment runs listens beyond what its plan names, and its router's
admin token shows in no argv, log line or answer.

The borrowed deployment (tests/borrowed.py) has the default deployment's shape: one prefill and
one decode vLLM worker with the shared-storage KV channel, a router, and the console, supervisor
and job worker of `manage.py up`; only the model differs (a tiny random-weight Llama). Every
process of that tree is read, vLLM's engine cores included. The NIXL channel's workers, which
open side channels and UCX listeners as well, are read in tests/nodes/test_two_nodes.py, on
the NIXL pair across two nodes that file starts anyway.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.borrowed import FACILITY, Handle

pytestmark = pytest.mark.vllm

WILDCARDS = frozenset({"0.0.0.0", "::"})
TOKEN_VARIABLE = "PDSERVE_ROUTER_ADMIN_TOKEN"


def bound_sockets(pids: Iterable[int]) -> list[tuple[str, str, str, int]]:
    """Every listening TCP socket and every unconnected (hence receiving) UDP socket of
    ``pids``, v4 and v6: (process, protocol, address, port)."""
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            name = f"{pid} {' '.join(process.cmdline())[:120]}"
            connections = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        for conn in connections:
            if conn.type == socket.SOCK_STREAM and conn.status != psutil.CONN_LISTEN:
                continue
            if conn.type == socket.SOCK_DGRAM and conn.raddr:
                continue
            protocol = ("tcp" if conn.type == socket.SOCK_STREAM else "udp") + (
                "6" if conn.family == socket.AF_INET6 else "")
            found.append((name, protocol, conn.laddr.ip, conn.laddr.port))
    return found


def planned_addresses(deployment: dict[str, Any]) -> set[str]:
    return {deployment["router"]["host"], *(worker["host"] for worker in deployment["workers"])}


def assert_bound_within(sockets: list[tuple[str, str, str, int]], named: set[str]) -> None:
    """No socket on a wildcard or an outward address that ``named`` does not list."""
    wide = [s for s in sockets if s[2] in WILDCARDS and s[2] not in named]
    assert not wide, "bound to every address although the plan names " \
                     f"{sorted(named)}:\n" + "\n".join(map(str, wide))
    # Beyond the wildcards: nothing on an outward address either.
    outward = [s for s in sockets if s[2] not in named and not ipaddress.ip_address(s[2]).is_loopback]
    assert not outward, "\n".join(map(str, outward))


def assert_nothing_listens_wide(handle: Handle) -> list[tuple[str, str, str, int]]:
    deployment = handle.deployment()
    sockets = bound_sockets(FACILITY.pids())
    assert_bound_within(sockets, planned_addresses(deployment))
    ports = {port for *_, port in sockets}
    planned = {deployment["router"]["port"], *(w["port"] for w in deployment["workers"])}
    assert planned <= ports, f"planned ports {sorted(planned)} not all seen among {sorted(ports)}"
    return sockets


def admin_token(handle: Handle) -> str:
    """The router's admin token, read where it belongs: the router's environment."""
    pid = handle.processes()["router"]["pid"]
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name == TOKEN_VARIABLE.encode():
            token = value.decode()
            assert len(token) >= 32, "the admin token is too short to search for"
            return token
    raise AssertionError(f"the router (pid {pid}) has no {TOKEN_VARIABLE}")


def leaks(token: str, text: str | bytes) -> bool:
    # Its first half too: a log line or an error message cut short still gives that much away.
    needles = (token, token[: len(token) // 2])
    if isinstance(text, bytes):
        return any(needle.encode() in text for needle in needles)
    return any(needle in text for needle in needles)


def console_answers(handle: Handle) -> dict[str, str]:
    """What the console tells an operator about the deployment and its processes."""
    answers = {}
    paths = [f"/api/v1/deployments/{handle.deployment_id}/", "/api/v1/deployments/",
             f"/api/v1/processes/?deployment={handle.deployment_id}"]
    for process in handle.deployment()["processes"]:
        paths += [f"/api/v1/processes/{process['id']}/", f"/api/v1/processes/{process['id']}/logs",
                  f"/api/v1/processes/{process['id']}/logs/download"]
    for path in paths:
        response = handle.call("GET", path)
        assert response.status_code == 200, (path, response.status_code, response.text[:300])
        answers[path] = response.text
    return answers


def router_answers(handle: Handle, token: str) -> dict[str, str]:
    answers = {}
    with httpx.Client(base_url=handle.router, timeout=10) as client:
        for path in ("/health", "/metrics", "/v1/models"):
            answers[path] = client.get(path).text
        for path in ("/admin/backends", "/admin/keys", "/admin/keys/usage"):
            authorized = client.get(path, headers={"Authorization": f"Bearer {token}"})
            assert authorized.status_code == 200, (path, authorized.text[:300])
            answers[path] = authorized.text
            # A near miss must not be answered with the right one.
            refused = client.get(path, headers={"Authorization": f"Bearer {token[:-1]}"})
            assert refused.status_code == 401
            answers[f"{path} refused"] = refused.text
    return answers


def test_nothing_listens_wide_and_the_admin_token_stays_in_the_environment(
        borrowed: Handle) -> None:
    sockets = assert_nothing_listens_wide(borrowed)
    print(f"\n{len(sockets)} bound sockets of {len(FACILITY.pids())} processes:")
    for entry in sorted(sockets, key=lambda s: s[3]):
        print("  ", *entry)

    token = admin_token(borrowed)
    for pid in FACILITY.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        assert not leaks(token, cmdline), f"pid {pid}'s argv holds the admin token"
    # Every line any process logged: workers, router, console, supervisor, job worker.
    logs = [*borrowed.data_dir.rglob("*.log"), borrowed.data_dir.parent / "up.log"]
    assert any(path.name == "router.log" for path in logs)
    for path in logs:
        assert not leaks(token, path.read_bytes()), f"{path} holds the admin token"
    for source, answer in {**console_answers(borrowed), **router_answers(borrowed, token)}.items():
        assert not leaks(token, answer), f"{source} answers with the admin token"
