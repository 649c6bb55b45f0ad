"""The vLLM servers of gates and measurements: one model alone in a plain server, asked of the
supervisor as a requested process and released when the ``with`` block ends."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from console.supervisor.models import ManagedProcess
from console.supervisor.process_requests import supervised
from inference.output_gate import SERVER_START_TIMEOUT_S, ReferenceServer, free_port, server_command


def served(server: ReferenceServer, kind: str, slot: str,
           log_path: Path) -> AbstractContextManager[ManagedProcess]:
    """``server`` on a free port, ready for the block (its row's ``url``), then released."""
    port = free_port()
    argv, env = server_command(replace(server, port=port), port)
    return supervised(kind, slot, argv, env, log_path, port, SERVER_START_TIMEOUT_S)
