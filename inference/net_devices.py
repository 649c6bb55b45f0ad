"""The network devices UCX may use for a worker: those that reach the address it advertises.

Which interface holds an address is known only on the machine that has it, so this is asked
where the worker's command is built for starting it: by the supervisor on its node, or by
``python -m inference.launch`` on any node. A command built elsewhere (the console showing a
remote node's plan, the Kubernetes export's ``$(POD_IP)``) leaves the choice to UCX.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import psutil

# Where Linux lists RDMA devices (InfiniBand, RoCE), one directory per device with its ports.
SYS_INFINIBAND = Path("/sys/class/infiniband")


def ucx_net_devices(address: str, rdma: bool) -> str | None:
    """``UCX_NET_DEVICES`` for a worker advertising ``address``; None: every device (UCX's
    default), for an address that is not this machine's.

    A loopback address is reached over ``lo`` alone. Another address of this machine: the
    interface holding it, since UCX over every interface also offers the peer the ones it
    cannot route to (a docker0 bridge has the same subnet on every machine, so a peer
    connects to itself there). With ``rdma``, the machine's active RDMA ports as well: UCX's
    rc transport runs over them whatever IP address the interface has.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.is_loopback:
        return "lo"
    interface = _interface_holding(ip)
    if interface is None:
        return None
    return ",".join([interface, *(rdma_ports() if rdma else [])])


def _interface_holding(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family not in (socket.AF_INET, socket.AF_INET6):
                continue  # the interface's MAC address
            # IPv6 link-local addresses carry their scope: fe80::1%eth0.
            if ipaddress.ip_address(entry.address.split("%", 1)[0]) == ip:
                return name
    return None


def rdma_ports() -> list[str]:
    """This machine's active RDMA ports as UCX names them, e.g. ``mlx5_0:1``."""
    if not SYS_INFINIBAND.is_dir():
        return []
    return sorted(
        f"{device.name}:{port.name}"
        for device in SYS_INFINIBAND.iterdir()
        for port in (device / "ports").glob("*")
        if "ACTIVE" in (port / "state").read_text(encoding="ascii")
    )
