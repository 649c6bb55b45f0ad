"""Several hosts on one machine, each a Linux network namespace, for multi-node tests.

``Hosts(["node-a", "node-b"])`` is a context manager that builds::

    root namespace: bridge pdn-<tag>-br, 10.231.X.1/24  <- the tests, the console, the relays
      |-- veth pdn-<tag>-h0 ... pdn-<tag>-n0 in netns pdn-<tag>-node-a, 10.231.X.2/24
      '-- veth pdn-<tag>-h1 ... pdn-<tag>-n1 in netns pdn-<tag>-node-b, 10.231.X.3/24

Each namespace has ``lo`` up and a default route via the bridge address, so the hosts reach
each other over the bridge (layer 2: no IP forwarding in the root namespace is needed) and
reach whatever listens on the bridge address, or on 0.0.0.0, in the root namespace. A process
in a host sees only that host's ``lo`` and veth: its 127.0.0.1 is its own.

Names and subnet. ``<tag>`` is the test process's pid in base 36 (5 characters) and one
character counting the ``Hosts`` of that process, so two pytest runs, or two ``Hosts`` in one
run, never share a name; interface names stay within Linux's 15 characters
(``pdn-00abc0-h12``). The third octet X is the first /24 of 10.231.0.0/16, starting from one
derived from the pid, that no address or route of the root namespace overlaps.

Names and DNS: each host's /etc/hosts (``ip netns exec`` bind-mounts /etc/netns/NAME/hosts)
names every host, so ``node-b`` resolves on ``node-a``; its resolver asks its own 127.0.0.1,
where nothing listens, since no DNS server is reachable from a host and every lookup would
otherwise wait for the resolver's timeout (see ``Hosts._write_etc``).

Leftovers. Cleanup (``close``, run by ``__exit__`` also after a failure, and by ``__enter__``
when building fails half-way) kills every process in the namespaces (``ip netns pids``: also
those a test started without ``popen``, or that outlived their parent), stops the relays,
deletes the veths, the namespaces (and their /etc/netns files) and the bridge, checks that
none of them is left, and raises ``CleanupError`` naming whatever it could not undo. A run
that was killed (SIGKILL, a CI timeout) cleans nothing; the next ``Hosts`` started on the
machine removes every namespace and link of this module whose pid is no longer alive
(``sweep_stale``), and any with its own names (a killed run whose pid was reused).

Forwarders: PostgreSQL and Redis listen only on 127.0.0.1 of the root namespace, which no
host can reach. ``Hosts(forwards=[5432, 6379])`` (or ``hosts.forward(port)``) listens on the
bridge address and relays each connection to 127.0.0.1:port. The relay is a small asyncio TCP
relay on one thread of the test process rather than socat, because:

- it needs nothing installed (socat would be one more Debian package for ``make test``);
- it lives and dies with the ``Hosts`` that started it: no child process to track, kill or
  leave behind, and ``close`` waits until every relayed connection is closed;
- a target that refuses is recorded in ``Hosts.relay_failures`` (and logged), which a test can
  assert on, instead of in a socat's stderr nobody reads.

The relay connects from 127.0.0.1, so PostgreSQL's trust rule for 127.0.0.1/32 still applies
to a host's connection (``inet_client_addr()`` is 127.0.0.1), and so does Redis's protected
mode. Its cost (a copy through Python per chunk) matters only for bulk traffic, and none goes
through it: the console can listen on the bridge address itself (uvicorn ``--host``), and KV
goes from host to host over the veths.

Running a process in a host: ``host.popen(argv, env=...)`` and ``host.run(argv)`` (which
checks the exit code, and raises ``CommandFailed`` with the output) prefix ``ip netns exec
NAME``, which execs the command in place: the Popen's pid is the command's own. As with
subprocess, ``env`` replaces the whole environment (pass ``{**os.environ, ...}`` to add to it).

UCX (NIXL's transport) across the veth:

- ``UCX_TLS=tcp`` (``self`` may be added: it only moves data within one process). Not ``sm``
  (posix, sysv) nor ``cma``: UCX decides that a peer is reachable over shared memory when it
  has the same system id, which is the kernel's boot id, and the same IPC namespace (and, for
  cma, the same pid namespace). ``ip netns exec`` changes only the network (and mount)
  namespace, so two hosts of one machine pass that check, and UCX would move KV through
  /dev/shm or process_vm_readv, never touching the veth; the test would prove nothing about
  the network. Measured (tests/test_netns.py, a 16 MiB NIXL READ from node-b to node-a):
  with ``UCX_TLS=tcp`` 16.9 MB came in on node-a's veth, with ``tcp,self,sm`` 900 bytes.
  pdserve's CPU default (``inference.kv_channels.UCX_TRANSPORTS["cpu"]``, ``tcp,self,sm``) is
  right between real machines, whose boot ids differ, but a multi-node test here must
  override it.
- ``UCX_NET_DEVICES`` = the host's veth (``host.interface``). ``inference.net_devices`` already
  gives that: asked inside the namespace for the host's address, it finds the veth, since
  psutil lists the interfaces of the caller's namespace (tests/test_netns.py checks it). Without
  it UCX would also offer the peer ``lo``, which in the other namespace is the peer itself.
- The NIXL side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST``) is the host's address: the other host
  connects to it over the bridge.

Limits: needs root (namespaces, veths, a bridge) and iproute2 (``make netns`` installs it). On a
machine whose firewall drops forwarded packets while br_netfilter passes bridged frames through
iptables (Docker sets the FORWARD policy to DROP), host-to-host traffic would be dropped; this
machine (a VM with its own kernel) has no iptables rules. The sweep knows a pid as alive only
in its own pid namespace.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

POSTGRES_PORT = 5432
REDIS_PORT = 6379

# Every namespace and root-namespace link this module makes is named pdn-<pid><seq>-...: the
# sweep recognises its own by this pattern and reads the pid that made them from it.
PREFIX = "pdn"
_NAME = re.compile(rf"^{PREFIX}-(?P<pid>[0-9a-z]{{5}})(?P<seq>[0-9a-z])-")
_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"
# A rarely used corner of 10/8 (Docker takes 172.17/16, libvirt 192.168.122/24); a /24 of it
# that overlaps an address or route of the machine is passed over anyway.
SUPERNET = ipaddress.ip_network("10.231.0.0/16")
# A host is .2 and up of its /24, and its index is at most two digits in its veth's name.
MAX_HOSTS = 99
IFNAMSIZ = 15  # Linux's limit on an interface name, without the terminating NUL
# `ip netns exec NAME` bind-mounts each file of /etc/netns/NAME/ over its namesake in /etc.
NETNS_ETC = Path("/etc/netns")

# The seq characters in use by this process's open Hosts.
_open_seqs: set[str] = set()
_seq_lock = threading.Lock()


def ip_binary() -> str:
    path = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None)
    if path is None:
        raise FileNotFoundError("no `ip` command: install iproute2 (`make netns`)")
    return path


class CommandFailed(subprocess.CalledProcessError):
    """A checked command's non-zero exit, with what it printed in the message (a bare
    CalledProcessError shows only the exit code, and the reason is on stderr)."""

    def __str__(self) -> str:
        said = "\n".join(part.strip() for part in (self.stderr, self.output)
                         if isinstance(part, str) and part.strip())
        return f"{super().__str__()}\n{said}" if said else super().__str__()


class CleanupError(RuntimeError):
    """What ``Hosts.close`` could not undo; every other step was still tried."""


def _run(argv: Sequence[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if result.returncode != 0:
        raise CommandFailed(result.returncode, list(argv), result.stdout, result.stderr)
    return result


def ip(*args: str) -> str:
    """Runs ``ip ARGS`` in the root namespace and returns its output."""
    return _run([ip_binary(), *args]).stdout


def _ip_json(*args: str) -> list[dict[str, Any]]:
    # `ip -j netns list` prints nothing at all when there is no namespace.
    out = ip("-j", *args).strip()
    return json.loads(out) if out else []


def netns_names() -> list[str]:
    return [entry["name"] for entry in _ip_json("netns", "list")]


def link_names() -> list[str]:
    """The root namespace's interfaces."""
    return [entry["ifname"] for entry in _ip_json("link", "show")]


def netns_pids(netns: str) -> list[int]:
    return [int(pid) for pid in ip("netns", "pids", netns).split()]


def _base36(number: int, width: int) -> str:
    digits, rest = "", number
    while rest:
        rest, digit = divmod(rest, 36)
        digits = _DIGITS36[digit] + digits
    if len(digits) > width:
        raise ValueError(f"{number} does not fit {width} base-36 digits")
    return digits.rjust(width, "0")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which nothing here may reap, has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return False
    # The state follows the command name, which is in parentheses and may contain any.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_netns_processes(netns: str, grace_s: float = 5.0) -> None:
    """SIGTERM every process in ``netns``, SIGKILL those still there after ``grace_s``; raises
    if any is still there after that (in uninterruptible sleep)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue  # ended between the listing and the signal: what was wanted
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and netns_pids(netns):
            time.sleep(0.05)
    left = netns_pids(netns)
    if left:
        raise RuntimeError(f"processes {left} still in netns {netns} after SIGKILL")


def _remove(netns: Iterable[str], links: Iterable[str]) -> None:
    """Kills the processes of ``netns``, deletes ``links`` (root side), then ``netns`` and their
    /etc/netns files, each only if it exists (a veth goes with its peer's namespace)."""
    netns = list(netns)
    existing = [name for name in netns if name in netns_names()]
    for name in existing:
        kill_netns_processes(name)
    present = link_names()
    # Veths before bridges: a bridge deleted first would only detach them.
    for link in sorted((link for link in links if link in present), key=lambda n: n.endswith("-br")):
        if link in link_names():  # deleting a veth's one end deletes the other
            ip("link", "del", link)
    for name in existing:
        ip("netns", "del", name)
    for name in netns:
        if (NETNS_ETC / name).exists():
            shutil.rmtree(NETNS_ETC / name)


def sweep_stale(own_tag: str | None = None) -> list[str]:
    """Removes this module's namespaces and links made by processes no longer alive, and those
    with the tag ``own_tag``; returns their names."""

    def stale(name: str) -> bool:
        match = _NAME.match(name)
        if match is None:
            return False
        if own_tag is not None and name.startswith(f"{PREFIX}-{own_tag}-"):
            return True
        return not alive(int(match["pid"], 36))

    etc = [entry.name for entry in NETNS_ETC.iterdir()] if NETNS_ETC.is_dir() else []
    netns = [name for name in dict.fromkeys(netns_names() + etc) if stale(name)]
    links = [name for name in link_names() if stale(name)]
    if netns or links:
        log.warning("removing leftovers of a killed earlier run: %s", ", ".join(netns + links))
        _remove(netns, links)
    return netns + links


def _free_subnet(start: int) -> ipaddress.IPv4Network:
    """The first /24 of SUPERNET, from the ``start``-th on, that overlaps no address or route of
    the root namespace."""
    taken = [ipaddress.ip_interface(f"{entry['local']}/{entry['prefixlen']}").network
             for link in _ip_json("-4", "addr", "show") for entry in link.get("addr_info", [])]
    # Every table: also the local one's addresses and broadcasts (dst without a length: /32).
    taken += [ipaddress.ip_network(route["dst"], strict=False)
              for route in _ip_json("-4", "route", "show", "table", "all") if route["dst"] != "default"]
    subnets = list(SUPERNET.subnets(new_prefix=24))
    for i in range(len(subnets)):
        subnet = subnets[(start + i) % len(subnets)]
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError(f"every /24 of {SUPERNET} is in use on this machine")


@dataclass
class Host:
    """One host: a network namespace with its end of a veth."""

    name: str
    netns: str
    address: str
    interface: str  # the veth's end in the namespace: UCX_NET_DEVICES for a process here
    peer: str  # the veth's end in the root namespace, a port of the bridge
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run in this host."""
        return [ip_binary(), "netns", "exec", self.netns, *argv]

    def popen(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[Any]:
        """Starts ``argv`` in this host (subprocess.Popen's arguments; ``env`` replaces the
        environment). ``Hosts.close`` kills it if it still runs."""
        process = subprocess.Popen(self.command(argv), env=env, **kw)
        self.processes.append(process)
        return process

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 60,
            check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Runs ``argv`` in this host to its end and returns its output (text); with ``check``,
        raises ``CommandFailed`` (exit code and output) unless it exits 0."""
        argv = self.command(argv)
        result = subprocess.run(argv, env=env, timeout=timeout, capture_output=True, text=True, **kw)
        if check and result.returncode != 0:
            raise CommandFailed(result.returncode, argv, result.stdout, result.stderr)
        return result

    def pids(self) -> list[int]:
        """Every process in this host's namespace."""
        return netns_pids(self.netns)

    def listening(self, port: int) -> bool:
        """Whether a TCP socket in this host listens on ``port`` (any address)."""
        return bool(self.run(["ss", "-Hltn", f"sport = :{port}"]).stdout.strip())

    def wait_listening(self, port: int, timeout: float = 15,
                       process: subprocess.Popen[Any] | None = None) -> None:
        """Waits until something in this host listens on ``port``; fails at once if ``process``
        (the one expected to listen) ends first."""
        deadline = time.monotonic() + timeout
        while not self.listening(port):
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{process.args} exited {process.returncode} before listening "
                                   f"on {self.name}:{port}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {self.name} ({self.address}):{port} "
                                   f"after {timeout} s")
            time.sleep(0.05)


class TcpRelay:
    """TCP forwarders on one asyncio loop in a thread of its own: each accepted connection is
    relayed both ways to its target, half-closes included, until both ends close."""

    def __init__(self) -> None:
        self.failures: list[str] = []  # targets that refused or failed a connection
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # Daemon: a test process interrupted before close() may still exit; close() joins it.
        self._thread = threading.Thread(target=self._loop.run_forever, name="netns-relay", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def forward(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        """Listens on ``listen`` and relays to ``target``; raises here if it cannot bind."""
        asyncio.run_coroutine_threadsafe(self._listen(listen, target), self._loop).result(timeout=10)

    def close(self) -> None:
        """Stops listening, closes every relayed connection, and ends the thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            raise RuntimeError("the relay's thread did not end")
        self._loop.close()

    async def _listen(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._relay(reader, writer, target)

        server = await asyncio.start_server(accepted, *listen, reuse_address=True)
        self._servers.append(server)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     target: tuple[str, int]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            try:
                target_r, target_w = await asyncio.open_connection(*target)
            except OSError as error:
                # The client sees its connection closed; the test sees why in failures.
                self.failures.append(f"{target[0]}:{target[1]}: {error}")
                log.warning("relay to %s:%s failed: %s", *target, error)
                return
            try:
                await asyncio.gather(self._pipe(client_r, target_w), self._pipe(target_r, client_w))
            finally:
                target_w.close()
        finally:
            client_w.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(1 << 16):
                sink.write(data)
                await sink.drain()
            # Half-close: the other end reads EOF and may still answer the other way.
            if not sink.is_closing():
                sink.write_eof()
        except OSError as error:
            # One end reset (a client killed mid-query): closing the other end ends the other
            # direction too, whose read then sees EOF, as a direct connection would.
            log.debug("relayed connection ended: %s", error)
            sink.close()

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)
                  and not isinstance(r, asyncio.CancelledError)]
        for server in self._servers:
            await server.wait_closed()
        if errors:
            raise RuntimeError(f"relayed connections failed while closing: {errors}")


class Hosts:
    """Hosts in network namespaces on one bridge; see the module's docstring.

    ``with Hosts(["node-a", "node-b"], forwards=[POSTGRES_PORT, REDIS_PORT]) as hosts:``
    then ``hosts["node-a"].popen(...)``, ``hosts.bridge_address``, ``hosts.relay_failures``.
    """

    def __init__(self, names: Sequence[str] = ("node-a", "node-b"), forwards: Iterable[int] = (),
                 kill_grace_s: float = 5.0) -> None:
        if not names or len(names) > MAX_HOSTS or len(set(names)) != len(names):
            raise ValueError(f"1 to {MAX_HOSTS} distinct host names, not {list(names)}")
        for name in names:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
                raise ValueError(f"host name {name!r}: lower-case letters, digits and '-' only")
        self.names = list(names)
        self._forwards = list(forwards)
        self.kill_grace_s = kill_grace_s
        self.tag = ""
        self.bridge = ""
        self.network: ipaddress.IPv4Network | None = None
        self.bridge_address = ""
        self.hosts: dict[str, Host] = {}
        self.relay: TcpRelay | None = None

    # Building

    def __enter__(self) -> Hosts:
        if os.geteuid() != 0:
            raise PermissionError("network namespaces, veths and bridges need root")
        self._take_tag()
        try:
            self._build()
        except BaseException as error:
            try:
                self.close()
            except CleanupError as cleanup:
                error.add_note(f"and cleaning up after it failed: {cleanup}")
            raise
        return self

    def _take_tag(self) -> None:
        with _seq_lock:
            free = [c for c in _DIGITS36 if c not in _open_seqs]
            if not free:
                raise RuntimeError(f"{len(_DIGITS36)} Hosts already open in this process")
            _open_seqs.add(free[0])
        self.tag = _base36(os.getpid(), 5) + free[0]
        self.bridge = f"{PREFIX}-{self.tag}-br"

    def _build(self) -> None:
        sweep_stale(own_tag=self.tag)
        self.network = _free_subnet(start=os.getpid() * 37 + int(self.tag[-1], 36))
        addresses = self.network.hosts()
        self.bridge_address = str(next(addresses))
        prefix = self.network.prefixlen
        # Spanning tree is off by default, so ports forward at once; forward_delay 0 in case.
        ip("link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
        ip("addr", "add", f"{self.bridge_address}/{prefix}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for index, name in enumerate(self.names):
            host = Host(name=name, netns=f"{PREFIX}-{self.tag}-{name}", address=str(next(addresses)),
                        interface=f"{PREFIX}-{self.tag}-n{index}", peer=f"{PREFIX}-{self.tag}-h{index}")
            assert max(len(host.interface), len(host.peer)) <= IFNAMSIZ
            self.hosts[name] = host
            ip("netns", "add", host.netns)
            ip("link", "add", host.peer, "type", "veth", "peer", "name", host.interface,
               "netns", host.netns)
            ip("link", "set", host.peer, "master", self.bridge, "up")
            ip("-n", host.netns, "link", "set", "lo", "up")
            ip("-n", host.netns, "addr", "add", f"{host.address}/{prefix}", "dev", host.interface)
            ip("-n", host.netns, "link", "set", host.interface, "up")
            ip("-n", host.netns, "route", "add", "default", "via", self.bridge_address)
        self._write_etc()
        for port in self._forwards:
            self.forward(port)

    def _write_etc(self) -> None:
        """Each host's /etc/hosts and /etc/resolv.conf (seen by the processes ``ip netns exec``
        starts there).

        No DNS server is reachable from a host (its packets to one stop in the root namespace,
        which does not forward), so every lookup waited for the resolver's timeout: Python's
        http.server, whose bind looks up its address's name, started 10 s late. The host's
        resolver asks its own 127.0.0.1 instead, where nothing listens, so a lookup fails at
        once; and its hosts file names every host, so ``node-b`` resolves on ``node-a``.
        """
        machine_hosts = Path("/etc/hosts").read_text(encoding="utf-8") if Path("/etc/hosts").exists() else ""
        names = "".join(f"{host.address} {host.name}\n" for host in self)
        for host in self:
            etc = NETNS_ETC / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"{machine_hosts.rstrip()}\n# pdserve test hosts (tests/netns.py)\n"
                                       f"{names}", encoding="utf-8")
            (etc / "resolv.conf").write_text(
                "# pdserve test host (tests/netns.py): no DNS server is reachable from here\n"
                "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n", encoding="utf-8")

    def forward(self, port: int, target: tuple[str, int] | None = None) -> None:
        """Relays connections to the bridge address's ``port`` (for the hosts) to ``target``,
        by default 127.0.0.1:``port`` of the root namespace."""
        if self.relay is None:
            self.relay = TcpRelay()
        self.relay.forward((self.bridge_address, port), target or ("127.0.0.1", port))

    # Using

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())

    @property
    def relay_failures(self) -> list[str]:
        return list(self.relay.failures) if self.relay else []

    def netns_names(self) -> list[str]:
        return [host.netns for host in self]

    def link_names(self) -> list[str]:
        """Its links in the root namespace."""
        return [self.bridge, *(host.peer for host in self)]

    # Cleaning up

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except CleanupError as cleanup:
            if exc is None:
                raise
            # The test's own failure stays the one reported; the cleanup's is added to it.
            exc.add_note(f"and cleaning up the hosts failed: {cleanup}")

    def close(self) -> None:
        """Kills the hosts' processes, stops the relay, deletes the namespaces, veths and the
        bridge; raises CleanupError naming each step that failed, after trying them all."""
        errors: list[str] = []

        def step(what: str, action: Any, *args: Any) -> None:
            try:
                action(*args)
            except Exception as error:  # collected, and raised once every step was tried
                log.error("netns cleanup: %s: %s", what, error)
                errors.append(f"{what}: {error}")

        present = set(netns_names())
        for host in self:
            if host.netns in present:
                step(f"kill the processes in {host.netns}", kill_netns_processes, host.netns,
                     self.kill_grace_s)
            for process in host.processes:
                # Already killed with its namespace; this reaps it (no zombie left behind).
                step(f"reap {process.args}", process.wait, 10)
        if self.relay is not None:
            step("stop the relay", self.relay.close)
        step("delete the veths, namespaces and bridge", _remove, self.netns_names(), self.link_names())
        with _seq_lock:
            _open_seqs.discard(self.tag[-1:])
        left = [n for n in netns_names() if n in self.netns_names()]
        left += [n for n in link_names() if n in self.link_names()]
        left += [str(NETNS_ETC / n) for n in self.netns_names() if (NETNS_ETC / n).exists()]
        if left:
            errors.append(f"still present: {', '.join(left)}")
        if errors:
            raise CleanupError("; ".join(errors))
