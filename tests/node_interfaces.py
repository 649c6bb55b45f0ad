"""A GPU node's network interfaces as psutil.net_if_addrs reports them, for tests that build a
worker's command as if on that node."""

from __future__ import annotations

import socket
from typing import NamedTuple

import psutil


class Address(NamedTuple):
    """The fields of psutil's snicaddr."""

    family: int
    address: str
    netmask: str | None = None
    broadcast: str | None = None
    ptp: str | None = None


# Node a (10.0.0.1) as it sees itself: loopback, its address on ens5, a docker bridge (the same
# subnet on every machine), and an IPv6 link-local address with its scope.
NODE_A_INTERFACES = {
    "lo": [Address(socket.AF_INET, "127.0.0.1"), Address(socket.AF_INET6, "::1")],
    "ens5": [Address(socket.AF_INET, "10.0.0.1"), Address(socket.AF_INET6, "fe80::a%ens5"),
             Address(psutil.AF_LINK, "02:00:00:00:00:0a")],
    "docker0": [Address(socket.AF_INET, "172.17.0.1")],
}
