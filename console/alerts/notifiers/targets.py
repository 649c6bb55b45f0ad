"""Where a webhook may send: public addresses, and the networks the deployer allows.

A team admin writes a notifier's URL and every team member reads its attempt log, so a URL must
not turn the console into a proxy into its own network: loopback (Redis, PostgreSQL, the
workers), private and unique-local networks, link-local (the cloud metadata service at
169.254.169.254 and fd00:ec2::254), CGNAT, multicast, unspecified and reserved addresses are
refused, also written as IPv4-mapped, IPv4-compatible, 6to4, Teredo or NAT64 IPv6 addresses.
``PDSERVE_WEBHOOK_ALLOWED_NETWORKS`` (settings) names the networks where in-house receivers
live.

Checked twice: when the notifier is saved (``check_url``: the URL's form, and its host when the
host is an address or a ``localhost`` name), and when each request is sent (``resolve``: every
address the name resolves to at that moment, since DNS answers change). The sender connects to
the address it checked, never resolving the name again.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SCHEMES = ("http", "https")
SETTING = "PDSERVE_WEBHOOK_ALLOWED_NETWORKS"
CGNAT = ipaddress.IPv4Network("100.64.0.0/10")  # RFC 6598 shared address space
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: an IPv4 address in the low 32 bits
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d
MASKED_TAIL = "/…"


class TargetRefused(ValueError):
    """The URL, or an address its host resolves to, is not one a webhook may reach."""


@dataclass(frozen=True)
class Target:
    """A checked destination: the address to connect to, and whether only the deployer's
    allowance (not the address being public) let it through."""

    address: IPAddress
    allowed_by_setting: bool


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries, where the network would deliver to it."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address
    if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def why_internal(address: IPAddress) -> str:
    """What makes ``address`` internal ("loopback", "private" ...), or "" when it is public."""
    for candidate in (address, _embedded_ipv4(address)):
        if candidate is None:
            continue
        if candidate.is_loopback:
            return "loopback"
        if candidate.is_link_local:
            return "link-local"
        if candidate.is_unspecified:
            return "unspecified"
        if candidate.is_multicast:
            return "multicast"
        if isinstance(candidate, ipaddress.IPv4Address) and candidate in CGNAT:
            return "shared (CGNAT)"
        if isinstance(candidate, ipaddress.IPv6Address) and candidate.is_site_local:
            return "site-local"
        if candidate.is_private:
            return "private"
        if candidate.is_reserved:
            return "reserved"
        if not candidate.is_global:
            return "not public"
    return ""


def allowed_by_setting(address: IPAddress) -> bool:
    embedded = _embedded_ipv4(address)
    return any(candidate in network
               for network in settings.PDSERVE_WEBHOOK_ALLOWED_NETWORKS
               for candidate in (address, embedded)
               if candidate is not None and candidate.version == network.version)


def check_address(address: IPAddress) -> Target:
    """The address as a target, or TargetRefused saying why."""
    reason = why_internal(address)
    if not reason:
        return Target(address, allowed_by_setting=False)
    if allowed_by_setting(address):
        return Target(address, allowed_by_setting=True)
    raise TargetRefused(f"{address} is a {reason} address; webhooks reach public addresses, "
                        f"and the networks {SETTING} names")


def _literal(host: str) -> IPAddress | None:
    """``host`` as an address: IPv6 in brackets, dotted IPv4, or the shorthand forms the C
    resolver reads as one (``127.1``, ``0x7f000001``, ``2130706433``)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str) -> None:
    """Refuse, when a notifier is saved, a URL a webhook may not have: another scheme than
    http(s), credentials in it, or a host that is an internal address or a ``localhost`` name.
    Names are resolved at each send, not here: their answers change."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise TargetRefused(f"not a URL: {exc}") from None
    if parts.scheme.lower() not in SCHEMES:
        raise TargetRefused("a webhook's URL is http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("credentials in the URL (user:password@) are not accepted: the URL "
                            "is shown and logged; put a token in its path or query instead")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetRefused("the URL has no host")
    literal = _literal(host)
    if literal is not None:
        check_address(literal)
    elif host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always loopback
        check_address(ipaddress.IPv4Address("127.0.0.1"))


def resolve(host: str, port: int) -> list[Target]:
    """Every address ``host`` resolves to now, each checked: TargetRefused if any is refused (a
    name with one internal answer is not a public receiver), or if there is none."""
    literal = _literal(host)
    if literal is not None:
        return [check_address(literal)]
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetRefused(f"{host} does not resolve: {exc}") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in answers:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise TargetRefused(f"{host} resolves to no address")
    targets = []
    for address in addresses:
        try:
            targets.append(check_address(address))
        except TargetRefused as exc:
            raise TargetRefused(f"{host} resolves to {exc}") from None
    return targets


# ---- masking ----------------------------------------------------------------------------------
def masked_url(url: str) -> str:
    """What a viewer sees of a webhook URL: ``https://hooks.example.com/…``. A receiver's URL is
    often its credential (Slack's, Discord's, Teams' carry their token in the path), so the
    path, query and any user info stay with whoever may edit the notifier."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "…"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{f':{port}' if port is not None else ''}{MASKED_TAIL}"


def audit_url(url: str) -> str:
    """The URL as the audit log keeps it: masked, with a tag that changes whenever the URL
    does, so an edit of its path shows as a change. The tag is keyed with the console's secret
    key: it confirms no guess of a URL to whoever reads the log."""
    if not url:
        return ""
    tag = hmac.new(settings.SECRET_KEY.encode(), url.encode(), hashlib.sha256).hexdigest()[:8]
    return f"{masked_url(url)} #{tag}"
