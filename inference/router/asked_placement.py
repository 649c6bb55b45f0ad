"""``X-Pdserve-Placement``: a request that names where its prompt is prefilled.

The router's PD policies choose per request whether prefill hands the KV to decode or decode
computes the prompt itself (adaptive.py), and that choice moves with the speed it measures. A
check that means to exercise one path, such as the verification report's prefill/decode pair
check or an operator reproducing a slow hand-off, names it instead: ``remote`` (prefill, then
decode with the KV hand-off) or ``local`` (decode computes the prompt).

Steering placement is the operator's, not a tenant's: the header is honoured from the
console's own key, and on a router that asks no key (or from the single legacy key) whose
every caller is the operator; any other key gets a 403 naming the header. The gateway does not
pass the header on (inference/gateway/forward.py), so its clients cannot send it.
"""

from __future__ import annotations

from collections.abc import Mapping

from inference.router.errors import RequestError
from inference.router.keys import CONSOLE_KEY_ID, ApiKey

PLACEMENT_HEADER = "X-Pdserve-Placement"
ASKABLE = ("remote", "local")


def asked_placement(headers: Mapping[str, str], key: ApiKey | None) -> str | None:
    """The placement the request names, or None; raises RequestError (400 for a value that is
    not one, 403 for a key that may not steer)."""
    asked = headers.get(PLACEMENT_HEADER)
    if asked is None:
        return None
    if asked not in ASKABLE:
        raise RequestError(400, f"{PLACEMENT_HEADER} must be one of {', '.join(ASKABLE)}",
                           param=PLACEMENT_HEADER)
    if key is not None and key.id != CONSOLE_KEY_ID:
        raise RequestError(403, f"only the console's own key may set {PLACEMENT_HEADER}",
                           param=PLACEMENT_HEADER, code="permission_denied")
    return asked
