"""Live facts about this machine's ports: who holds a port, what a process tree listens on."""

from __future__ import annotations

import errno
import socket

import psutil


def bind_errno(host: str, port: int) -> int | None:
    """The errno binding ``host:port`` fails with, or None when the port is free.

    SO_REUSEADDR as vLLM and uvicorn set it: a port only in TIME_WAIT counts as free, as it
    does for them.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno or errno.EADDRINUSE
    return None


def listeners() -> dict[int, set[int]]:
    """Listening TCP port -> pids holding it (pids of other users' processes need root)."""
    holders: dict[int, set[int]] = {}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr:
            holders.setdefault(conn.laddr.port, set())
            if conn.pid:
                holders[conn.laddr.port].add(conn.pid)
    return holders


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants; empty when it is gone."""
    try:
        leader = psutil.Process(pid)
        return {pid} | {child.pid for child in leader.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def listening_ports(pids: set[int]) -> set[int]:
    ports: set[int] = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        ports |= {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN and c.laddr}
    return ports


def describe_process(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        command = " ".join(process.cmdline()) or process.name()
    except psutil.NoSuchProcess:
        return f"pid {pid} (gone)"
    except psutil.AccessDenied:
        return f"pid {pid}"
    return f"pid {pid} ({command[:80]})"
