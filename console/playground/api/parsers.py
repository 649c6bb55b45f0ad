"""The chat's JSON body, read up to the router's body limit."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.parsers import BaseParser, JSONParser

from console.playground.proxy import ROUTER_MAX_BODY_BYTES, BodyTooLarge


class ChatParser(BaseParser):
    """JSON, as DRF's JSONParser reads it, from the request's stream. DRF reads the body of a
    JSONParser request through Django's ``HttpRequest.body``, bound by DATA_UPLOAD_MAX_MEMORY_SIZE
    (2.5 MiB), below what a chat with images may send: the router's body limit (4 MiB) bounds
    this one instead."""

    media_type = "application/json"

    def parse(self, stream: IO[bytes], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        raw = stream.read(ROUTER_MAX_BODY_BYTES + 1)
        if len(raw) > ROUTER_MAX_BODY_BYTES:
            raise BodyTooLarge(f"the request is more than {ROUTER_MAX_BODY_BYTES} bytes; the "
                               f"router accepts at most {ROUTER_MAX_BODY_BYTES} (its body "
                               "limit): send fewer or smaller images")
        return JSONParser().parse(io.BytesIO(raw), media_type, parser_context)
