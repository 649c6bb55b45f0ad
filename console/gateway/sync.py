"""Keeping routers, the gateway and the console in step, from the supervisor: every few seconds
the gateway's configuration is compared with the database (sync_gateway); each running
router reports key usage (stored as ``last_used_at``) and the version of its key set; a router
whose version is not the console's (it started while keys changed, or missed a push) gets the
current set; and its usage ledger's recent days are stored as ``UsageDay`` rows (usage.py), read
before the key set is compared, since the set carries the token budgets' spend (budgets.py). A
router whose usage or ledger cannot be read is skipped for the round, logged, and asked again
the next: the stored times and counts stay as they are, and no key set is pushed on a guess."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from django.db import connection

from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.router_admin import (
    AdminUnreadable,
    fetch_usage,
    fetch_usage_ledger,
    push_keys,
)
from console.gateway.routes_config import gateway_config
from console.gateway.services import key_set, record_usage
from console.gateway.usage import ledger_since, store_ledger
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.gateway")

SYNC_EVERY_S = 5.0


class KeySync:
    def __init__(self, interval_s: float = SYNC_EVERY_S) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> int:
        """One round over the ready routers. Returns how many answered."""
        ready = ManagedProcess.objects.filter(role="router", state=ManagedProcess.State.READY)
        answered = 0
        for deployment in Deployment.objects.filter(pk__in=ready.values("deployment")):
            try:
                usage = fetch_usage(deployment)
            except AdminUnreadable as exc:
                # Unknown, not "unused": nothing is recorded or pushed on it.
                log.warning("key usage of %s unreadable (%s); stored values kept, asking again "
                            "next round", deployment.name, exc)
                continue
            answered += 1
            record_usage(usage)
            # The ledger first: the key set carries the budgets' spend, this router's included.
            self.sync_ledger(deployment)
            wanted = key_set(deployment)
            if usage["version"] != wanted["version"]:
                log.info("router of %s has key set %r, not %r: pushing", deployment.name,
                         usage["version"], wanted["version"])
                # A failed push is logged there; the next round finds the version behind again.
                push_keys(deployment, wanted)
        self.sync_gateway()
        return answered

    @staticmethod
    def sync_ledger(deployment: Deployment) -> bool:
        """Store the router's usage ledger from the first day that may have changed on. Returns
        whether it was read; one that was not keeps the stored rows for the next round."""
        since = ledger_since(deployment, datetime.now(UTC).date())
        try:
            rows = fetch_usage_ledger(deployment, since)
        except AdminUnreadable as exc:
            log.warning("usage ledger of %s unreadable (%s); stored usage kept, asking again "
                        "next round", deployment.name, exc)
            return False
        store_ledger(deployment, rows)
        return True

    @staticmethod
    def sync_gateway() -> None:
        """The gateway's configuration follows the database: routers becoming ready or going,
        deployments made or deleted, keys and aliases. Its file is kept current for a restart,
        and each running replica whose version differs gets the new one."""
        if not gateway_process.enabled():
            return
        wanted = gateway_config()
        gateway_process.write_config(wanted)
        # A starting replica reads the file; only the ready ones are asked.
        ready = set(ManagedProcess.objects.filter(
            kind=ManagedProcess.Kind.GATEWAY, state=ManagedProcess.State.READY,
        ).values_list("slot", flat=True))
        for replica in gateway_process.replicas():
            name = gateway_process.slot(replica)
            if name not in ready:
                continue
            try:
                running = gateway_process.running_version(replica)
            except AdminUnreadable as exc:
                log.warning("gateway %s: configuration unreadable (%s); asking again next round",
                            name, exc)
                continue
            if running != wanted["version"]:
                log.info("gateway %s has configuration %r, not %r: pushing", name, running,
                         wanted["version"])
                gateway_process.push_config(wanted, replica)

    def start(self) -> None:
        def loop() -> None:
            try:
                while not self._stop.wait(self.interval_s):
                    try:
                        self.sync_once()
                    except Exception:  # a bad round must not end the thread; the next may work
                        log.exception("key sync round failed")
            finally:
                connection.close()

        self._thread = threading.Thread(target=loop, name="key-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
