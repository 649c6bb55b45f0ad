"""The CPU priority of the processes the supervisor starts.

The routers and the gateway relay every request: a moment they wait for a core is added to every
request's latency, and on a CPU node the engines leave no core free (NIXL's progress thread and
vLLM's engine loop spin even while idle, vllm-cpu-facts). Everything else the supervisor starts
computes (vLLM servers, quantization builders, measurements) and runs ``PDSERVE_ENGINE_NICE``
steps nicer than the supervisor, so a router, the gateway or the console that needs a core gets
it at once and the engines keep every cycle nobody else wants. On a node where the engines run
on GPUs this changes nothing they do.

Two values are set, because a Linux kernel with autogroups enabled (``kernel.sched_autogroup_
enabled``, the default of most distributions' kernels) shares the CPU between sessions first and
weighs a thread's nice value only against threads of its own session. Each child starts its own
session (engine.py: the group is what gets stopped), so there the thread nice alone changes
nothing, and the session's autogroup nice (``/proc/PID/autogroup``) is what makes the engines
yield. Without autogroups the thread nice is what counts. A supervisor in init's session (a
container whose commands never start a session: its ``/proc/self/autogroup`` reads empty) is
scheduled in the root group by its threads' nice, which is then the base of its children's.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from django.conf import settings

from console.supervisor.models import ManagedProcess

# At the supervisor's own priority: they relay requests rather than compute.
RELAYING_KINDS = (ManagedProcess.Kind.ROUTER, ManagedProcess.Kind.GATEWAY)
MAX_NICE = 19
AUTOGROUP_NICE = re.compile(r"nice (-?\d+)")
# Without CAP_SYS_ADMIN the kernel takes one autogroup change per tenth of a second (EAGAIN).
AUTOGROUP_RETRY_S = 0.11


def nice_steps(kind: str) -> int:
    """How many steps nicer than the supervisor a process of ``kind`` runs."""
    return 0 if kind in RELAYING_KINDS else settings.PDSERVE_ENGINE_NICE


def has_autogroups() -> bool:
    """Whether this kernel was built with autogroups."""
    return Path("/proc/self/autogroup").exists()


def autogroup_nice(pid: int | str) -> int | None:
    """The nice value of ``pid``'s autogroup, or None where it has none: a kernel built without
    autogroups, or a process of init's session (the kernel prints nothing for it)."""
    path = Path(f"/proc/{pid}/autogroup")
    if not path.exists():
        return None
    text = path.read_text()
    if not text:
        return None
    match = AUTOGROUP_NICE.search(text)
    if match is None:
        raise ValueError(f"{path} reads {text!r}, not 'autogroup-N nice V'")
    return int(match.group(1))


def lower_priority(pid: int, kind: str) -> None:
    """Make the just-started ``pid`` nicer by ``nice_steps(kind)``: its thread nice and its
    session's autogroup. Called at once after the exec, before the child's interpreter has
    started a thread: every thread it starts later, and every engine process it forks (in its
    session), inherits both (on Linux a nice value is per thread)."""
    steps = nice_steps(kind)
    if not steps:
        return
    value = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, 0) + steps)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, value)
        if has_autogroups():
            _set_autogroup_nice(pid, min(MAX_NICE, autogroup_base() + steps))
    except ProcessLookupError:
        # It exited already: the next tick reaps it and records its exit code like any other.
        return


def autogroup_base() -> int:
    """The nice value the supervisor's work weighs by against its children's autogroups: its own
    autogroup's, or its threads' where it is in init's session and so in the root group."""
    own_group = autogroup_nice("self")
    return os.getpriority(os.PRIO_PROCESS, 0) if own_group is None else own_group


def _set_autogroup_nice(pid: int, value: int) -> None:
    path = Path(f"/proc/{pid}/autogroup")
    try:
        path.write_text(str(value))
    except FileNotFoundError as exc:
        raise ProcessLookupError(pid) from exc
    except BlockingIOError:
        time.sleep(AUTOGROUP_RETRY_S)
        path.write_text(str(value))
