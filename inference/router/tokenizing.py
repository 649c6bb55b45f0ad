"""Prompts tokenized off the event loop, a bounded number at a time.

A 4 MB prompt takes the tokenizer seconds. On the event loop that would stall every stream,
every /health probe and every other request for as long, so a long prompt is tokenized in a
thread: the tokenizer's Rust core releases the GIL while it works (``encode_batch_fast``, see
prompts.py's ``_encoder``), and the loop keeps answering meanwhile. At most ``threads`` prompts
are tokenized at once (one per core by default: more would only share the cores); up to
``queue`` more wait for a thread, and past that a request is refused at once with
``TokenizerBusy`` (503 with Retry-After), as Envoy's overload manager refuses: the router is
overloaded, not the caller's key, and a waiting request holds its whole body in memory.

A short prompt is tokenized on the loop: for it the hop to a thread costs more than the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor

from inference.router.prompts import Prompt

# ~1 ms of tokenizing at ~1 us a token and ~4 characters a token: cheaper inline than a thread hop.
INLINE_CHARS = 4096
# A slot frees when some tokenization ends, which is seconds at worst.
BUSY_RETRY_S = 1


def default_threads() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class TokenizerBusy(Exception):
    """Every tokenizing thread is busy and the queue for them is full."""

    def __init__(self, threads: int, queue: int) -> None:
        super().__init__(f"the router is busy tokenizing ({threads} prompts at once, {queue} "
                         "waiting); try again shortly")
        self.retry_after_s = BUSY_RETRY_S


class Tokenizing:
    def __init__(self, threads: int, queue: int, inline_chars: int = INLINE_CHARS) -> None:
        self.threads = threads
        self.queue = queue
        self.inline_chars = inline_chars
        self.running = 0  # in a thread now (cancelled requests' too, until their thread ends)
        self.waiting = 0
        self._executor: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    async def ids(self, prompt: Prompt, may_refuse: bool = True) -> list[int]:
        """``prompt``'s token ids, computed off the loop if it is long. Raises TokenizerBusy
        when the queue is full, unless ``may_refuse`` is False (then it waits)."""
        if prompt.known_length is not None or len(prompt.text) <= self.inline_chars:
            return prompt.token_ids
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.threads)
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="tokenize")
        if may_refuse and self._slots.locked() and self.waiting >= self.queue:
            raise TokenizerBusy(self.threads, self.queue)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        assert self._executor is not None
        self.running += 1
        loop = asyncio.get_running_loop()
        work: Future[list[int]] = self._executor.submit(lambda: prompt.token_ids)
        # The slot frees when the thread is done, not when the request is: a client that
        # leaves cancels its wait, never the tokenizing under way, which keeps its core.
        work.add_done_callback(lambda _: self._release(loop))
        return await asyncio.wrap_future(work)

    async def count(self, prompt: Prompt) -> int:
        return len(await self.ids(prompt))

    def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to free
            loop.call_soon_threadsafe(self._freed)

    def _freed(self) -> None:
        self.running -= 1
        assert self._slots is not None
        self._slots.release()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
