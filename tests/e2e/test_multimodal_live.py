"""Images through prefill/decode: two tiny vision-language deployments, each one prefill and one
decode worker planned, checked and started through the borrowed console, asked with the
official `openai` client. One model has plain positions (Idefics3), the other multimodal rotary
positions (PaddleOCR-VL, M-RoPE), the family whose PD answers vLLM's users report differing
from a single server's.

The single server: the same request sent whole to the deployment's prefill worker, one engine
computing the prompt, the image and every token, asked before the router's request so that no
hand-off of that prompt exists yet. Through the router, prefill runs the vision encoder and the
prompt, the KV moves to decode, and decode continues: the greedy answers must be equal.

Also: two images in one message, an image in an earlier turn, a file and a remote URL the plan
allows (both read by the router and handed to the workers as the same bytes), each bad input of
issue 28 refused with a 400 naming the field before any worker is used, image tokens counted,
and degraded mode (no prefill worker) serving images as it serves text.
"""

from __future__ import annotations

import base64
import http.server
import io
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image, ImageDraw
from prometheus_client.parser import text_string_to_metric_families

from tests.borrowed import Handle
from tests.borrowed_plan import devices_shared
from tests.console.sockets import free_port
from tests.e2e.polling import expect_created, wait_until
from tests.tiny_vlm import shared_tiny_vlm
from tests.worker_key import worker_headers

pytestmark = pytest.mark.vllm

SMOLLM2 = Path(__file__).resolve().parents[2] / "data" / "models" / "smollm2-135m-instruct"
FAMILIES = {"idefics3": "tiny-idefics3", "paddle": "tiny-paddleocr-vl"}
MAX_IMAGES = 2
MAX_IMAGE_BYTES = 48 * 1024
ANSWER_TOKENS = 12
START_TIMEOUT_S = 420


def _png(seed: int, size: int = 64) -> bytes:
    """A small picture whose content differs with ``seed``: a gradient and a square."""
    image = Image.new("RGB", (size, size))
    draw = ImageDraw.Draw(image)
    for y in range(size):
        draw.line([(0, y), (size, y)], fill=((y * 4 + seed * 60) % 256, (seed * 90) % 256,
                                             (255 - y * 3) % 256))
    corner = 8 + (seed * 13) % 24
    draw.rectangle([corner, corner, corner + 20, corner + 20], fill=((seed * 37) % 256, 40, 200))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _noise_png(size: int) -> bytes:
    """A PNG that does not compress: larger than MAX_IMAGE_BYTES at a small size."""
    image = Image.frombytes("RGB", (size, size), random.Random(size).randbytes(size * size * 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _user(text: str, *urls: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}, *map(_image, urls)]}


@dataclass
class VlmDeployment:
    name: str
    served: str
    id: int
    router: str
    prefill: str
    decode: str
    data_dir: Path

    def worker_headers(self) -> dict[str, str]:
        return worker_headers(self.data_dir, self.name)


class _Images(http.server.BaseHTTPRequestHandler):
    """A web server of two pictures, for the plan's allowed domain."""

    pictures: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.pictures.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    _Images.pictures = {"/one.png": _png(1), "/two.png": _png(2)}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("media")
    (folder / "one.png").write_bytes(_png(1))
    return folder



def _plan(name: str, family: str, media_dir: Path) -> dict[str, Any]:
    # The team is named: tests before this one (the gateway's) may have made the admin a member
    # of other teams, and then a plan must say whose it is.
    return {"name": name, "team": "default", "base_model": family, "served_model_name": name,
            "mode": "pd",
            "max_model_len": 2048, "longest_request": 2048, "kv_cache_gib": 1,
            "dtype": "float32", "kv_channel": "shared-storage",
            "sampling_defaults": {"temperature": 0},
            "max_images_per_prompt": MAX_IMAGES, "max_image_bytes": MAX_IMAGE_BYTES,
            "media_paths": [str(media_dir)], "media_domains": ["127.0.0.1"],
            # Six workers share this node's memory: no processor cache (2 GiB a worker by
            # default, which memory.fit counts), a few tiny images are processed again instead.
            "extra_engine_args": ["--mm-processor-cache-gb", "0"],
            "prefill": {"variant": f"{family}/f32", "instances": [
                {"cpu_cores": "0", "port": free_port(), "side_channel_port": free_port(),
                 "share_devices": True}]},
            "decode": {"variant": f"{family}/f32", "instances": [
                {"cpu_cores": "1", "port": free_port(), "side_channel_port": free_port(),
                 "share_devices": True}]},
            "router": {"port": free_port()}}



@contextmanager
def _started_vlms(handle: Handle, media_dir: Path) -> Iterator[dict[str, VlmDeployment]]:
    """Both tiny VLM deployments, started together (four workers beside the borrowed two),
    stopped and deleted after."""
    made: dict[str, VlmDeployment] = {}
    with devices_shared(handle):
        try:
            for key, family in FAMILIES.items():
                path = shared_tiny_vlm(SMOLLM2, family)
                expect_created(handle.call("POST", "/api/v1/models/", json={"name": family}))
                variant = expect_created(handle.call("POST", "/api/v1/variants/", json={
                    "base_model": family, "name": "f32", "path": str(path)}))
                assert "image" in variant["modalities"], variant
                created = expect_created(handle.call("POST", "/api/v1/deployments/",
                                               json=_plan(f"vlm-{key}", family, media_dir)))
                assert created["checks"]["ok"], created["checks"]
                workers = {w["role"]: f"http://127.0.0.1:{w['port']}" for w in created["workers"]}
                made[key] = VlmDeployment(name=created["name"], served=created["served_model_name"],
                                          id=created["id"], router=created["router_url"],
                                          prefill=workers["prefill"], decode=workers["decode"],
                                          data_dir=handle.data_dir)
            for deployment in made.values():
                response = handle.call("POST", f"/api/v1/deployments/{deployment.id}/start")
                assert response.status_code == 202, response.text
            for deployment in made.values():
                wait_until(lambda d=deployment: handle.call(
                    "GET", f"/api/v1/deployments/{d.id}/").json()["state"] == "ready",
                    f"{deployment.name} to be ready", START_TIMEOUT_S)
            yield made
        finally:
            for deployment in made.values():
                handle.call("POST", f"/api/v1/deployments/{deployment.id}/stop")
            for deployment in made.values():
                wait_until(lambda d=deployment: handle.call(
                    "GET", f"/api/v1/deployments/{d.id}/").json()["state"] == "stopped",
                    f"{deployment.name} to stop", 120)
                assert handle.call("DELETE", f"/api/v1/deployments/{deployment.id}/").status_code == 204


def _single_server(deployment: VlmDeployment, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The answer of one engine that computes the whole request: the prefill worker, asked
    directly with the full max_tokens. Its text and prompt tokens."""
    response = httpx.post(f"{deployment.prefill}/v1/chat/completions", timeout=120,
                          headers=deployment.worker_headers(), json={
                              "model": deployment.served, "messages": messages,
                              "max_tokens": ANSWER_TOKENS, "temperature": 0})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]


def _through_router(client: openai.OpenAI, deployment: VlmDeployment,
                    messages: list[dict[str, Any]], stream: bool) -> str:
    if stream:
        chunks = client.chat.completions.create(model=deployment.served, messages=messages,
                                                max_tokens=ANSWER_TOKENS, temperature=0,
                                                stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(model=deployment.served, messages=messages,
                                            max_tokens=ANSWER_TOKENS, temperature=0)
    return answer.choices[0].message.content or ""


def _first_chunk_s(url: str, headers: dict[str, str], model: str, png: bytes) -> float:
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", headers=headers, timeout=120, json={
            "model": model, "messages": [_user("Describe the picture.", _data_url(png))],
            "max_tokens": 2, "temperature": 0, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - started
    raise AssertionError("the stream ended without content")


def _print_ttft(deployment: VlmDeployment, family: str) -> None:
    """TTFT of an image request through PD against the single server, each on pictures it has
    not seen (no prefix or processor cache), for the closing note; a report, not a target."""
    single = [_first_chunk_s(deployment.prefill, deployment.worker_headers(), deployment.served,
                             _png(seed)) for seed in range(10, 15)]
    through = [_first_chunk_s(deployment.router, {}, deployment.served, _png(seed))
               for seed in range(20, 25)]
    print(f"{family} image TTFT p50: single server {statistics.median(single) * 1000:.0f} ms, "
          f"through PD {statistics.median(through) * 1000:.0f} ms")


def _prompt_tokens_through_router(deployment: VlmDeployment, messages: list[dict[str, Any]]) -> int:
    response = httpx.post(f"{deployment.router}/v1/chat/completions", timeout=120, json={
        "model": deployment.served, "messages": messages, "max_tokens": 1, "temperature": 0})
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


def test_images_through_prefill_decode(borrowed: Handle, media_dir: Path, image_server: str,
                                       tmp_path: Path) -> None:
    """One borrow for all of it: the two deployments start once (about a minute together)."""
    with _started_vlms(borrowed, media_dir) as vlms:
        for family in sorted(FAMILIES):
            _equal_to_a_single_server(vlms[family], family, media_dir, image_server)
        _usage_counts_image_tokens(borrowed, vlms["idefics3"])
        _bad_images_refused(vlms["idefics3"], tmp_path, image_server)
        _degraded_mode(borrowed, vlms["paddle"])


def _equal_to_a_single_server(deployment: VlmDeployment, family: str, media_dir: Path,
                              image_server: str) -> None:
    one, two = _data_url(_png(1)), _data_url(_png(2))
    conversations = {
        "one image": [_user("Describe the picture.", one)],
        "another image": [_user("Describe the picture.", two)],
        "two images in one message": [_user("Compare the pictures.", one, two)],
        "an image in an earlier turn": [
            _user("What is in this picture?", one),
            {"role": "assistant", "content": "A square on a gradient."},
            {"role": "user", "content": "And what colour is the square?"}],
    }
    client = openai.OpenAI(base_url=f"{deployment.router}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    answers: dict[str, str] = {}
    for what, messages in conversations.items():
        single, prompt_tokens = _single_server(deployment, messages)
        for stream in (False, True):
            through = _through_router(client, deployment, messages, stream)
            assert through == single, (what, stream, through, single)
        answers[what] = single
        print(f"{family} {what}: {prompt_tokens} prompt tokens, {single!r}")
    # The picture reaches the model: another picture, another answer.
    assert answers["one image"] != answers["another image"], answers

    # A file under the plan's media path and a URL on its allowed domain: the router reads
    # them and hands the workers the same bytes as the data URL, so the answer is the same.
    for url in ((media_dir / "one.png").as_uri(), f"{image_server}/one.png"):
        assert _through_router(client, deployment, [_user("Describe the picture.", url)],
                               stream=False) == answers["one image"], url

    _print_ttft(deployment, family)

    # Image tokens count: the prompt with the picture is longer than its text alone.
    text_only = [{"role": "user", "content": [{"type": "text", "text": "Describe the picture."}]}]
    assert _prompt_tokens_through_router(deployment, [_user("Describe the picture.", one)]) > \
        _prompt_tokens_through_router(deployment, text_only)


def _usage_counts_image_tokens(handle: Handle, deployment: VlmDeployment) -> None:
    """The usage ledger (the router's, read into the console every 5 s) counts an image
    request's prompt tokens as vLLM counted them, image tokens included."""
    def ledger() -> int:
        rows = handle.call("GET", "/api/v1/usage/", params={
            "deployment": deployment.id, "group_by": "deployment"}).json()["results"]
        return sum(row["prompt_tokens"] for row in rows)

    def settled() -> int | None:
        first = ledger()
        time.sleep(6)  # past one sync round: what the earlier requests counted is in
        return first if ledger() == first else None

    before = wait_until(settled, "the usage ledger to settle", 60)
    with_image = _prompt_tokens_through_router(
        deployment, [_user("Describe the picture.", _data_url(_png(7)))])
    text_alone = _prompt_tokens_through_router(deployment, [{"role": "user", "content": [
        {"type": "text", "text": "Describe the picture."}]}])
    assert with_image > text_alone
    wait_until(lambda: ledger() - before == with_image + text_alone,
               f"the ledger to grow by {with_image} + {text_alone} prompt tokens", 30)


def _requests_served(url: str, headers: dict[str, str]) -> float:
    """Requests a worker finished, by vLLM's own counter."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def _bad_images_refused(deployment: VlmDeployment, tmp_path: Path, image_server: str) -> None:
    """Each bad input gets a 400 naming the field, and no worker serves a request meanwhile."""
    outside = tmp_path / "outside.png"
    outside.write_bytes(_png(3))
    good = _data_url(_png(1))
    cases = {
        "too many images": ([_user("Three?", good, good, good)], "messages"),
        "too large": ([_user("Big?", _data_url(_noise_png(160)))],
                      "messages[0].content[1].image_url.url"),
        "unreadable": ([_user("What?", "data:image/png;base64," + base64.b64encode(
            b"not a picture at all").decode())], "messages[0].content[1].image_url.url"),
        "file outside the plan's media paths": ([_user("What?", outside.as_uri())],
                                                "messages[0].content[1].image_url.url"),
        "a domain the plan does not allow": ([_user("What?", "http://localhost:9/one.png")],
                                             "messages[0].content[1].image_url.url"),
        "missing on the allowed domain": ([_user("What?", f"{image_server}/none.png")],
                                          "messages[0].content[1].image_url.url"),
    }
    headers = deployment.worker_headers()
    before = {url: _requests_served(url, headers) for url in (deployment.prefill, deployment.decode)}
    for what, (messages, param) in cases.items():
        response = httpx.post(f"{deployment.router}/v1/chat/completions", timeout=60, json={
            "model": deployment.served, "messages": messages, "max_tokens": 4})
        assert response.status_code == 400, (what, response.text)
        error = response.json()["error"]
        assert error["param"] == param, (what, error)
        print(f"{what}: {error['message']}")
    after = {url: _requests_served(url, headers) for url in before}
    assert after == before


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def _degraded_mode(borrowed: Handle, deployment: VlmDeployment) -> None:
    """With the prefill worker gone, decode prefills the image prompt itself. Last: the
    supervisor restarts the killed worker, and the deployment is stopped whatever its state."""
    messages = [_user("Describe the picture.", _data_url(_png(1)))]
    expected, _ = _single_server(deployment, messages)
    prefill = next(p for p in borrowed.call("GET", f"/api/v1/deployments/{deployment.id}/")
                   .json()["processes"] if p["slot"] == "prefill-0")
    degraded = _metric(deployment.router, "pdserve_router_degraded_total", missing_role="prefill")
    os.killpg(prefill["pid"], signal.SIGKILL)
    wait_until(lambda: httpx.get(f"{deployment.router}/health", timeout=5).json().get("degraded")
          == "prefill", "the router to run without prefill", 60)
    client = openai.OpenAI(base_url=f"{deployment.router}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    assert _through_router(client, deployment, messages, stream=True) == expected
    assert _metric(deployment.router, "pdserve_router_degraded_total",
                   missing_role="prefill") == degraded + 1
