"""Whether a node agent holds the console's secret key, told without telling the key.

A worker's key derives from PDSERVE_SECRET_KEY where it is started (console/supervisor/
worker_keys.py): an agent with another secret would start workers that answer /health (so look
ready) and refuse the console's router, collector and gates with 401. The console's supervisor
publishes an HMAC of a fixed message under its secret in Redis; an agent compares its own
before it starts anything.
"""

from __future__ import annotations

import hashlib
import hmac

import redis
from django.conf import settings

KEY = "pdserve:secret-fingerprint"


def fingerprint() -> str:
    return hmac.new(settings.SECRET_KEY.encode(), b"pdserve secret fingerprint",
                    hashlib.sha256).hexdigest()[:32]


def publish(client: redis.Redis) -> None:
    client.set(KEY, fingerprint())


def mismatch(client: redis.Redis) -> str | None:
    """Why this process's secret is not the console's, or None when they agree. A console that
    has not published yet (an older one, or its supervisor not started) is not a mismatch: the
    agent's first heartbeat and its workers' 401s would still tell."""
    published = client.get(KEY)
    if published is None:
        return None
    if hmac.compare_digest(published.decode(), fingerprint()):
        return None
    return ("PDSERVE_SECRET_KEY differs from the console's: this node's workers would refuse "
            "the console's router, collector and gates (401), and its router admin tokens "
            "would not match; start the agent with the console's PDSERVE_SECRET_KEY")
