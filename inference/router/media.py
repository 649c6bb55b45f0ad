"""Image parts of chat requests: the deployment's limits, and bad input refused with a 400 that
names the part, before any worker is called. File and remote images are read by the router and
sent on inlined as data URLs, so prefill and decode (and decode's /tokenize) see the same bytes
and need no file or network access; a data URL goes on as the client sent it.

Parts are read as vLLM 0.32 reads them (chat_utils.py ``_parse_chat_message_content_mm_part``),
so that no form vLLM takes as media slips past the limits. Audio, video and embeddings are
refused: this data plane serves text and images only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from PIL import Image

from inference.router.config import RouterConfig
from inference.router.errors import RequestError
from inference.router.metrics import RouterMetrics

# Part types vLLM reads as text (TEXT_PART_TYPES, plus tool references).
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
IMAGE_PARTS = frozenset({"image_url", "input_image"})
REFUSED_PARTS = frozenset({"image_embeds", "audio_embeds", "video_embeds", "image_pil", "audio_url",
                           "input_audio", "video_url"})
# The keys vLLM looks for, in its order, in a part without a type (or with a uuid).
UNTYPED_KEYS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds",
                "prompt_embeds", "audio_url", "input_audio", "video_url")
# What vLLM's own data URL parsing takes: one media type, then base64.
DATA_HEADER = re.compile(r"image/[A-Za-z0-9.+-]+;base64", re.IGNORECASE)


class MediaRefused(RequestError):
    """A 400 for an image part; ``reason`` labels pdserve_router_image_refusals_total."""

    def __init__(self, reason: str, message: str, param: str) -> None:
        super().__init__(400, message, param=param)
        self.reason = reason


@dataclass(frozen=True)
class ImageRef:
    """One image part: where it sits in the body, its URL, and the field an error names."""

    message: int
    part: int
    url: str
    param: str
    nested: bool  # the URL is image_url.url (else image_url itself is the URL string)


def _kind(part: dict[str, Any]) -> str | None:
    """The part's media kind as vLLM reads it; None for text (or what vLLM refuses itself)."""
    kind = part.get("type")
    if kind is not None and part.get("uuid") is None:
        return kind if isinstance(kind, str) and kind not in TEXT_PARTS else None
    return next((key for key in UNTYPED_KEYS if key in part), None)


def _image_ref(part: dict[str, Any], message: int, number: int, where: str) -> ImageRef:
    value = part.get("image_url")
    if isinstance(value, dict) and isinstance(value.get("url"), str):
        return ImageRef(message, number, value["url"], f"{where}.image_url.url", nested=True)
    # vLLM takes a plain string for input_image and untyped parts, not for typed image_url.
    if isinstance(value, str) and part.get("type") != "image_url":
        return ImageRef(message, number, value, f"{where}.image_url", nested=False)
    raise MediaRefused("bad_part", "an image part needs 'image_url' as an object with a string "
                       "'url'", f"{where}.image_url")


class MediaGate:
    """The image limits of one router (RouterConfig's --max-image* and --media-* settings)."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics) -> None:
        self.max_images = config.max_images
        self.max_bytes = config.max_image_bytes
        self.max_pixels = config.max_image_pixels
        self.dirs = tuple(Path(path).resolve() for path in config.media_paths)
        self.domains = frozenset(host.lower() for host in config.media_domains)
        self.timeout = aiohttp.ClientTimeout(total=config.media_fetch_timeout_s)
        self.metrics = metrics

    async def inline(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``body`` with its file and remote images inlined (``body`` itself if none was), and
        its number of images. Raises MediaRefused, having counted it."""
        try:
            refs = self._image_parts(body.get("messages"))
            if not refs:
                return body, 0
            if len(refs) > self.max_images:
                raise MediaRefused("too_many", f"{len(refs)} images in the request; this "
                                   f"deployment accepts at most {self.max_images}", "messages")
            urls = await self._load_all(refs)
        except MediaRefused as exc:
            self.metrics.image_refusals.labels(exc.reason).inc()
            raise
        self.metrics.images.inc(len(refs))
        return _with_urls(body, refs, urls), len(refs)

    def _image_parts(self, messages: Any) -> list[ImageRef]:
        refs: list[ImageRef] = []
        # Not a list: the request went "unparsed_messages" and vLLM refuses it itself.
        for index, message in enumerate(messages if isinstance(messages, list) else ()):
            content = message.get("content") if isinstance(message, dict) else None
            for number, part in enumerate(content if isinstance(content, list) else ()):
                if not isinstance(part, dict) or (kind := _kind(part)) is None:
                    continue
                where = f"messages[{index}].content[{number}]"
                if kind in REFUSED_PARTS:
                    raise MediaRefused("unsupported_part", f"'{kind}' parts are not served: this "
                                       "data plane serves text and images only", where)
                if kind not in IMAGE_PARTS:
                    continue  # an unknown type: vLLM names it in its own 400
                if self.max_images == 0:
                    raise MediaRefused("no_images", "this model accepts no images", where)
                refs.append(_image_ref(part, index, number, where))
        return refs

    async def _load_all(self, refs: list[ImageRef]) -> list[str]:
        # A session per request with remote images: they are rare next to text requests, and
        # the router then keeps no connections to image hosts between requests.
        remote = self.domains and any(ref.url[:4].lower() == "http" for ref in refs)
        session = aiohttp.ClientSession(timeout=self.timeout) if remote else None
        try:
            # Fetched at once; the first failure in the request's order is the one answered.
            results = await asyncio.gather(*(self._load(ref, session) for ref in refs),
                                           return_exceptions=True)
        finally:
            if session is not None:
                await session.close()
        if failed := next((r for r in results if isinstance(r, BaseException)), None):
            raise failed
        return [str(result) for result in results]

    async def _load(self, ref: ImageRef, session: aiohttp.ClientSession | None) -> str:
        """The URL to send on: the client's data URL, or the image inlined as one."""
        scheme = ref.url.partition(":")[0].lower()
        if scheme == "data":
            await asyncio.to_thread(self._check_data_url, ref)
            return ref.url
        if scheme == "file":
            data = await asyncio.to_thread(self._read_file, ref)
        elif scheme in ("http", "https"):
            data = await self._fetch(ref, session)
        else:
            raise MediaRefused("bad_url", "an image URL must be a data:, file:// or http(s):// "
                               "URL", ref.param)
        return await asyncio.to_thread(self._data_url, data, ref.param)

    def _check_data_url(self, ref: ImageRef) -> None:
        """Runs in a thread: decoding and inspecting a large image takes milliseconds."""
        header, comma, payload = ref.url[5:].partition(",")
        if not comma or not DATA_HEADER.fullmatch(header):
            raise MediaRefused("bad_data_url", "an image data URL must read "
                               "data:image/<type>;base64,<data>", ref.param)
        # Bounded before decoding: base64 holds 3 bytes in each 4 characters.
        if len(payload) > 4 * -(-self.max_bytes // 3):
            raise self._too_large(ref.param)
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise MediaRefused("bad_data_url", f"the data URL is not valid base64: {exc}",
                               ref.param) from None
        if len(data) > self.max_bytes:
            raise self._too_large(ref.param)
        self._inspect(data, ref.param)

    def _read_file(self, ref: ImageRef) -> bytes:
        """Runs in a thread: resolving and reading are file system calls."""
        if not self.dirs:
            raise MediaRefused("file_refused", "file image URLs are not allowed by this "
                               "deployment (it has no media paths)", ref.param)
        parts = urlsplit(ref.url)
        if parts.netloc not in ("", "localhost"):
            raise MediaRefused("file_refused", "a file URL must name no host", ref.param)
        try:
            path = Path(unquote(parts.path)).resolve()
        except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte
            raise MediaRefused("file_refused", f"cannot resolve the file path: {exc}", ref.param) from None
        if not any(path.is_relative_to(directory) for directory in self.dirs):
            raise MediaRefused("file_refused", "the file is outside this deployment's media paths", ref.param)
        # Checked before opening: opening a FIFO would block the thread.
        if not path.is_file():
            raise MediaRefused("file_refused", "no such file in the media paths", ref.param)
        try:
            with path.open("rb") as file:
                data = file.read(self.max_bytes + 1)
        except OSError as exc:
            raise MediaRefused("file_refused", f"cannot read the file: {exc.strerror}", ref.param) from None
        if len(data) > self.max_bytes:
            raise self._too_large(ref.param)
        return data

    async def _fetch(self, ref: ImageRef, session: aiohttp.ClientSession | None) -> bytes:
        if session is None:
            raise MediaRefused("remote_refused", "remote image URLs are not allowed by this "
                               "deployment's plan", ref.param)
        try:
            host = urlsplit(ref.url).hostname
        except ValueError as exc:
            raise MediaRefused("bad_url", f"not a valid URL: {exc}", ref.param) from None
        if host not in self.domains:
            raise MediaRefused("remote_refused", f"the image host {host!r} is not among this "
                               "deployment's media domains", ref.param)
        data = bytearray()
        try:
            # No redirects: one would lead to a host outside the allowed domains.
            async with session.get(ref.url, allow_redirects=False) as response:
                if not 200 <= response.status < 300:
                    raise MediaRefused("fetch_failed", f"fetching the image was answered HTTP "
                                       f"{response.status}", ref.param)
                if (response.content_length or 0) > self.max_bytes:
                    raise self._too_large(ref.param)
                # Bounded while reading: a Content-Length may be absent or wrong.
                async for chunk in response.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > self.max_bytes:
                        raise self._too_large(ref.param)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MediaRefused("fetch_failed", "could not fetch the image: "
                               f"{exc or type(exc).__name__}", ref.param) from None
        return bytes(data)

    def _data_url(self, data: bytes, param: str) -> str:
        """Runs in a thread, as _check_data_url does."""
        image_format = self._inspect(data, param)
        mime = Image.MIME.get(image_format, f"image/{image_format.lower()}")
        return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"

    def _inspect(self, data: bytes, param: str) -> str:
        """The image's format, once its size is within the limit and its structure checked.
        ``open`` reads only the header: a bomb is refused before any pixel is decoded."""
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if width * height > self.max_pixels:
                    raise MediaRefused("too_many_pixels", f"the image is {width}x{height} pixels; "
                                       f"this deployment accepts at most {self.max_pixels}", param)
                image.verify()
                return str(image.format)
        except MediaRefused:
            raise
        except Image.DecompressionBombError as exc:  # above Pillow's own limit
            raise MediaRefused("too_many_pixels", str(exc), param) from None
        except Exception as exc:  # Pillow's decoders raise many kinds on bad bytes
            raise MediaRefused("unreadable", f"unreadable image: {exc or type(exc).__name__}",
                               param) from None

    def _too_large(self, param: str) -> MediaRefused:
        return MediaRefused("too_large", f"the image exceeds {self.max_bytes} bytes", param)


def _with_urls(body: dict[str, Any], refs: list[ImageRef], urls: list[str]) -> dict[str, Any]:
    """``body`` with each changed URL in place; ``body`` itself when none changed, so that its
    bytes go on exactly as the client sent them."""
    changed = [(ref, url) for ref, url in zip(refs, urls, strict=True) if url is not ref.url]
    if not changed:
        return body
    # Copied on write: the client's parsed body is left as it came.
    messages = list(body["messages"])
    for ref, url in changed:
        message = messages[ref.message] = dict(messages[ref.message])
        content = message["content"] = list(message["content"])
        part = content[ref.part]
        content[ref.part] = ({**part, "image_url": {**part["image_url"], "url": url}}
                             if ref.nested else {**part, "image_url": url})
    return {**body, "messages": messages}
