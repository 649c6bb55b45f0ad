"""One side of a NIXL READ over UCX between two processes, for tests/test_netns.py: the target
registers a buffer and publishes its agent metadata and address in a directory both see; the
initiator reads the buffer, checks every byte, and notifies the target, which then exits.

    python tests/nixl_xfer.py target|initiator DIRECTORY SIZE

UCX takes its transports and devices from the environment (UCX_TLS, UCX_NET_DEVICES).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

DEADLINE_S = 60.0
FILL = 7  # the target's bytes; the initiator's buffer starts as zeros


def main(role: str, rendezvous: Path, size: int) -> None:
    agent = nixl_agent(role, nixl_agent_config(backends=["UCX"]))
    buffer = np.full(size, FILL if role == "target" else 0, dtype=np.uint8)
    address = buffer.ctypes.data
    agent.register_memory(agent.get_reg_descs([(address, size, 0, "")], "DRAM"))
    deadline = time.monotonic() + DEADLINE_S
    if role == "target":
        (rendezvous / "address").write_text(str(address))
        # Renamed into place, so the initiator never reads half of it.
        (rendezvous / "metadata.part").write_bytes(agent.get_agent_metadata())
        (rendezvous / "metadata.part").rename(rendezvous / "metadata")
        while b"read" not in agent.get_new_notifs().get("initiator", []):
            if time.monotonic() > deadline:
                sys.exit(f"target: no notification from the initiator within {DEADLINE_S} s")
            time.sleep(0.01)
        print("served", flush=True)
        return
    while not (rendezvous / "metadata").exists():
        if time.monotonic() > deadline:
            sys.exit(f"initiator: no metadata from the target within {DEADLINE_S} s")
        time.sleep(0.01)
    remote = agent.add_remote_agent((rendezvous / "metadata").read_bytes())
    remote_address = int((rendezvous / "address").read_text())
    handle = agent.initialize_xfer("READ", agent.get_xfer_descs([(address, size, 0)], "DRAM"),
                                   agent.get_xfer_descs([(remote_address, size, 0)], "DRAM"),
                                   remote, b"read")
    start = time.monotonic()
    state = agent.transfer(handle)
    while state not in ("DONE", "ERR"):
        if time.monotonic() > deadline:
            sys.exit(f"initiator: transfer still {state} after {DEADLINE_S} s")
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        sys.exit(f"initiator: transfer ended {state}")
    if not (buffer == FILL).all():
        sys.exit("initiator: the bytes read differ from the target's")
    print(f"read {size} bytes in {time.monotonic() - start:.3f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
