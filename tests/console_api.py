"""The console's REST API as the heavy suites' stacks call it: a token-authenticated client."""

from __future__ import annotations

from typing import Any

import httpx


class ConsoleApi:
    """For a stack (a dataclass) with ``console`` (its base URL) and ``token`` fields."""

    console: str
    token: str

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.console, timeout=60,
                            headers={"Authorization": f"Token {self.token}"})

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.api() as client:
            return client.request(method, path, **kwargs)
