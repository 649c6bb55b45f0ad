"""Schemathesis hooks (SCHEMATHESIS_HOOKS=tests.fuzz.hooks): the fuzzer signs in as the live
console's superuser and signs in again every few seconds, since among the operations it fuzzes
is revoking API tokens, its own included."""

from __future__ import annotations

import os
from typing import Any

import httpx
import schemathesis

# Each sign-in hashes the password (slow on purpose): a few a minute.
REFRESH_S = 15


@schemathesis.auth(refresh_interval=REFRESH_S)
class ConsoleToken:
    def get(self, case: Any, context: Any) -> str:
        response = httpx.post(f"{os.environ['PDSERVE_FUZZ_URL']}/api/v1/auth/token/", timeout=30,
                              json={"username": os.environ["PDSERVE_FUZZ_USERNAME"],
                                    "password": os.environ["PDSERVE_FUZZ_PASSWORD"]})
        response.raise_for_status()
        return str(response.json()["token"])

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Token {data}"}
