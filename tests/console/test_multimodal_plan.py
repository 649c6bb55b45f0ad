"""Issue 28, the plan: image limits and sources stored and validated, passed to the workers of a
multimodal variant and to the router, carried by revisions, and judged before a start
(multimodal.processor, multimodal.limits, memory.fit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from console.catalog.models import BaseModel, Variant
from console.catalog.services import register_variant
from console.checks.memory import estimate
from console.control.worker_specs import process_specs
from console.deployments import engine_args
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import GIB
from console.fleet.services import local_node
from console.rollouts import revisions
from inference.launch import LaunchError, WorkerSpec, build_command
from inference.router.config import build_parser, config_from_args
from tests.console.test_multimodal_catalog import copy_model
from tests.console.test_plans import counts, form_data, plan_body
from tests.console.tiny_models import make_plan, register, run, use_variant

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/"
IMAGE_FIELDS = ("max_images_per_prompt", "max_image_bytes", "max_image_pixels", "media_paths",
                "media_domains")


@pytest.fixture
def vlm(tiny_vlms: dict[str, Path]) -> Variant:
    return register_variant(BaseModel.objects.create(name="tiny-vlm"), "f32",
                            str(tiny_vlms["tiny-idefics3"]))


def vlm_plan(tmp_path: Path, variant: Variant, **fields: Any) -> Deployment:
    return make_plan(tmp_path, "tiny-vlm-1p1d", variant=variant, dtype="float32", **fields)


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def router_config(argv: list[str]) -> Any:
    """The router's own reading of the argv the console gives it."""
    return config_from_args(build_parser().parse_args(argv[3:]))


# ---- the plan's fields over REST and in the form ---------------------------------------------


def test_image_fields_default_and_are_stored(api: APIClient, tmp_path: Path) -> None:
    variant = register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")
    body = api.post(URL, plan_body(variant), format="json").json()
    assert {key: body[key] for key in IMAGE_FIELDS} == {
        "max_images_per_prompt": 1, "max_image_bytes": 2 * 1024 * 1024,
        "max_image_pixels": 4096 * 4096, "media_paths": [], "media_domains": []}
    images = tmp_path / "images"
    images.mkdir()
    wanted = {"max_images_per_prompt": 3, "max_image_bytes": 1000, "max_image_pixels": 640 * 480,
              "media_paths": [str(images)], "media_domains": ["images.example.com", "cdn.test"]}
    patched = api.patch(f"{URL}{body['id']}/", wanted, format="json")
    assert patched.status_code == 200, patched.content
    assert {key: patched.json()[key] for key in IMAGE_FIELDS} == wanted
    read = api.get(f"{URL}{body['id']}/").json()
    assert {key: read[key] for key in IMAGE_FIELDS} == wanted
    stored = Deployment.objects.get(pk=body["id"])
    assert {key: getattr(stored, key) for key in IMAGE_FIELDS} == wanted


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_images_per_prompt", -1, "greater than or equal to 0"),
    ("max_images_per_prompt", 65, "less than or equal to 64"),
    ("max_image_bytes", 0, "greater than or equal to 1"),
    ("max_image_pixels", 16384 * 16384 + 1, "less than or equal to"),
    ("media_paths", ["relative/images"], "must be an absolute path"),
    ("media_paths", ["/no/such/pdserve/images"], "is not an existing directory"),
    ("media_paths", ["/srv/../etc"], "must not contain '..'"),
    ("media_paths", "/tmp", "expected a JSON list of directories"),
    ("media_paths", ["/tmp", "/tmp"], "given more than once"),
    ("media_domains", ["https://images.example.com"], "is not a host name"),
    ("media_domains", ["images.example.com:443"], "is not a host name"),
    ("media_domains", ["images.example.com/x"], "is not a host name"),
    ("media_domains", ["-bad.example.com"], "is not a host name"),
    ("media_domains", [""], "is not a host name"),
    ("media_domains", [7], "expected a JSON list of host names"),
])
def test_a_bad_image_field_is_400_naming_it_and_writes_nothing(
        api: APIClient, tmp_path: Path, field: str, value: Any, message: str) -> None:
    variant = register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")
    refused = api.post(URL, plan_body(variant, **{field: value}), format="json")
    assert refused.status_code == 400, refused.content
    assert list(refused.json()) == [field]
    assert message in " ".join(refused.json()[field])
    assert counts() == (0, 0)

    created = api.post(URL, plan_body(variant), format="json").json()
    before = (Deployment.objects.get(pk=created["id"]).__dict__.copy(),
              list(WorkerPlan.objects.values_list("pk", "port", "cpu_cores")))
    # With a change of the pools that would be valid alone: neither is written.
    patched = api.patch(f"{URL}{created['id']}/", {
        field: value, "served_model_name": "renamed",
        "decode": {"variant": variant.pk, "instances": [{}]}}, format="json")
    assert patched.status_code == 400
    assert field in patched.json()
    stored = Deployment.objects.get(pk=created["id"])
    assert (stored.served_model_name, getattr(stored, field)) == (
        "tiny", before[0][field])
    assert list(WorkerPlan.objects.values_list("pk", "port", "cpu_cores")) == before[1]


def test_the_form_saves_the_image_fields_and_the_page_shows_them(owner: User,
                                                                tmp_path: Path) -> None:
    variant = register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")
    browser = Client()
    browser.force_login(owner)
    response = browser.post("/deployments/new/", form_data(
        variant, local_node(), max_images_per_prompt="2", media_paths=json.dumps([str(tmp_path)]),
        media_domains='["images.example.com"]'))
    assert response.status_code == 302, response.content.decode()[:3000]
    saved = Deployment.objects.get(name="tiny-form")
    assert (saved.max_images_per_prompt, saved.media_paths, saved.media_domains) == (
        2, [str(tmp_path)], ["images.example.com"])
    html = browser.get("/deployments/tiny-form/").content.decode()
    assert "2 per request" in html
    assert f"files in <code>{tmp_path}</code>" in html and "https from images.example.com" in html

    refused = browser.post("/deployments/new/", form_data(
        variant, local_node(), name="tiny-form-2", media_domains='["http://x.test"]'))
    assert refused.status_code == 400
    assert "is not a host name" in refused.content.decode()
    assert not Deployment.objects.filter(name="tiny-form-2").exists()


def test_a_users_engine_flags_may_not_set_what_the_plan_owns() -> None:
    for flags in (["--limit-mm-per-prompt", '{"image": 9}'],
                  ["--limit_mm_per_prompt={\"image\": 9}"], ["--language-model-only"]):
        with pytest.raises(ValidationError, match="max_images_per_prompt"):
            engine_args.validate_engine_args(flags)
    # The processor cache is a size to tune, which the memory check then counts.
    engine_args.validate_engine_args(["--mm-processor-cache-gb", "0.5"])


# ---- command lines ---------------------------------------------------------------------------


def test_a_vlm_plans_workers_and_router_get_the_image_flags(
        tmp_path: Path, settings: Any, vlm: Variant) -> None:
    settings.DATA_DIR = tmp_path / "data"
    images = tmp_path / "images"
    images.mkdir()
    deployment = vlm_plan(tmp_path, vlm, max_images_per_prompt=2, max_image_bytes=123456,
                          max_image_pixels=1000 * 1000, media_paths=[str(images)],
                          media_domains=["images.example.com", "cdn.test"])
    specs = {spec.slot: spec for spec in process_specs(deployment)}
    for slot in ("prefill-0", "decode-0"):
        argv = specs[slot].argv
        assert flag_values(argv, "--limit-mm-per-prompt") == ['{"image":2}']
        assert flag_values(argv, "--mm-processor-cache-gb") == ["1"]
    router = specs["router"].argv
    assert flag_values(router, "--max-images") == ["2"]
    assert flag_values(router, "--max-image-bytes") == ["123456"]
    assert flag_values(router, "--max-image-pixels") == ["1000000"]
    assert flag_values(router, "--media-path") == [str(images)]
    assert flag_values(router, "--media-domain") == ["images.example.com", "cdn.test"]
    config = router_config(router)
    assert (config.max_images, config.max_image_bytes, config.max_image_pixels,
            config.media_paths, config.media_domains) == (
        2, 123456, 1000 * 1000, (str(images),), ("images.example.com", "cdn.test"))


def test_vllm_reads_the_workers_image_flags_as_meant(tmp_path: Path, settings: Any,
                                                     vlm: Variant) -> None:
    settings.DATA_DIR = tmp_path / "data"
    argv = next(s.argv for s in process_specs(vlm_plan(tmp_path, vlm, max_images_per_prompt=3))
                if s.slot == "decode-0")
    flags = argv[argv.index("--limit-mm-per-prompt"):][:4]
    # vLLM 0.32's own `vllm serve` parser and multimodal config (imported once, a few seconds).
    with engine_args.keeping_environment():
        from vllm.config.multimodal import MultiModalConfig
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    config = MultiModalConfig(limit_per_prompt=parsed.limit_mm_per_prompt,
                              mm_processor_cache_gb=parsed.mm_processor_cache_gb)
    assert (config.get_limit_per_prompt("image"), config.mm_processor_cache_gb) == (3, 1.0)


def test_a_text_plan_gets_no_multimodal_flags_and_the_router_takes_no_image(
        tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"
    deployment = make_plan(tmp_path, max_images_per_prompt=4)
    specs = {spec.slot: spec for spec in process_specs(deployment)}
    for slot in ("prefill-0", "decode-0"):
        assert "--limit-mm-per-prompt" not in specs[slot].argv
        assert "--mm-processor-cache-gb" not in specs[slot].argv
    router = specs["router"].argv
    assert flag_values(router, "--max-images") == ["0"]
    assert (flag_values(router, "--media-path"), flag_values(router, "--media-domain")) == ([], [])
    assert router_config(router).max_images == 0


def test_a_revision_carries_the_image_count_to_a_rollouts_workers(
        tmp_path: Path, settings: Any, vlm: Variant) -> None:
    settings.DATA_DIR = tmp_path / "data"
    deployment = vlm_plan(tmp_path, vlm, max_images_per_prompt=2)
    live = revisions.ensure_live(deployment)
    assert live.spec["max_images_per_prompt"] == 2
    draft, report = revisions.create_draft(deployment, {"max_images_per_prompt": 5}, {}, None)
    assert report.ok, report.errors
    assert revisions.diff(live.spec, draft.spec) == {"max_images_per_prompt": [2, 5]}
    green = revisions.shadow_workers(deployment, draft.spec)
    assert {w.deployment.max_images_per_prompt for w in green} == {5}
    deployment.refresh_from_db()
    assert deployment.max_images_per_prompt == 2  # the plan is unchanged until promotion


# ---- multimodal.processor --------------------------------------------------------------------


def test_equal_processors_pass_and_a_text_only_plan_says_so(tmp_path: Path,
                                                            tiny_vlms: dict[str, Path]) -> None:
    base = BaseModel.objects.create(name="tiny-vlm")
    a = register_variant(base, "a", str(tiny_vlms["tiny-idefics3"]))
    b = register_variant(base, "b", str(copy_model(tiny_vlms["tiny-idefics3"], tmp_path / "b")))
    deployment = vlm_plan(tmp_path, a)
    use_variant(deployment, b)
    outcome = run(deployment, "multimodal.processor")
    assert outcome.status == "pass", outcome.results
    assert "text + image" in outcome.summary and a.processor_sha256[:12] in outcome.summary

    text = run(make_plan(tmp_path), "multimodal.processor")
    assert text.status == "pass"
    assert text.summary.startswith("text-only")


def test_a_pair_whose_processor_configurations_differ_is_refused(
        tmp_path: Path, tiny_vlms: dict[str, Path]) -> None:
    base = BaseModel.objects.create(name="tiny-vlm")
    a = register_variant(base, "a", str(tiny_vlms["tiny-idefics3"]))
    changed = copy_model(tiny_vlms["tiny-idefics3"], tmp_path / "b")
    config = json.loads((changed / "processor_config.json").read_text())
    config["image_seq_len"] = 9
    (changed / "processor_config.json").write_text(json.dumps(config))
    (changed / "preprocessor_config.json").write_text(json.dumps({"do_resize": False}))
    b = register_variant(base, "b", str(changed))
    deployment = vlm_plan(tmp_path, a)
    use_variant(deployment, b)
    outcome = run(deployment, "multimodal.processor")
    assert outcome.status == "error"
    (result,) = outcome.results
    assert "processor configurations differ" in result.message
    # Both sides, by role and variant, with their hashes; the files that differ.
    assert f"prefill (a): processor {a.processor_sha256[:12]}" in result.message
    assert f"decode (b): processor {b.processor_sha256[:12]}" in result.message
    assert "files that differ: preprocessor_config.json, processor_config.json" in result.message


def test_a_text_model_beside_a_vlm_is_refused(tmp_path: Path, vlm: Variant) -> None:
    deployment = vlm_plan(tmp_path, vlm)
    use_variant(deployment, register(BaseModel.objects.get(name="tiny-vlm"), tmp_path, "text"))
    outcome = run(deployment, "multimodal.processor")
    assert outcome.status == "error"
    assert "the variants take different inputs: prefill (f32): text + image; decode (text): " \
        "text" in outcome.results[0].message


# ---- multimodal.limits -----------------------------------------------------------------------


def test_limits_pass_when_every_worker_and_the_router_agree(tmp_path: Path, vlm: Variant) -> None:
    outcome = run(vlm_plan(tmp_path, vlm, max_images_per_prompt=3), "multimodal.limits")
    assert outcome.status == "pass", outcome.results
    assert outcome.summary.startswith("prefill, decode (f32): 3 image; router: 3 image(s)")


def test_limits_that_differ_between_prefill_and_decode_are_an_error(tmp_path: Path,
                                                                   vlm: Variant) -> None:
    deployment = vlm_plan(tmp_path, vlm, max_images_per_prompt=2)
    use_variant(deployment, register(BaseModel.objects.get(name="tiny-vlm"), tmp_path, "text"))
    outcome = run(deployment, "multimodal.limits")
    assert outcome.status == "error"
    assert ("the workers would take different numbers of images: prefill (f32): 2 image; "
            "decode (text): text only; the router lets 0 through") in outcome.results[0].message


def test_image_settings_on_a_text_only_plan_are_a_warning(tmp_path: Path) -> None:
    deployment = make_plan(tmp_path)
    assert run(deployment, "multimodal.limits").status == "pass"  # the default count alone
    Deployment.objects.filter(pk=deployment.pk).update(max_images_per_prompt=4,
                                                       media_domains=["images.example.com"])
    outcome = run(deployment, "multimodal.limits")
    assert outcome.status == "warning"
    message = outcome.results[0].message
    assert "max_images_per_prompt 4; media_domains images.example.com" in message
    assert "the router refuses every image (--max-images 0)" in message


# ---- memory.fit ------------------------------------------------------------------------------


def test_memory_fit_counts_the_processor_and_encoder_caches_once_each(tmp_path: Path,
                                                                     vlm: Variant) -> None:
    deployment = vlm_plan(tmp_path, vlm)
    worker = deployment.workers.get(role="decode")
    found = estimate(deployment, worker)
    # The vision encoder is in parameter_count: the weights are every parameter once.
    assert found.weights == vlm.parameter_count * 4  # float32
    assert found.processor_cache == 2 * GIB  # 1 GiB in the API server, 1 in the engine core
    assert found.encoder_cache == 2048 * 2 * 64 * 4  # budget tokens x width x float32
    assert found.total == (found.weights + found.kv_cache + found.runtime + 2 * GIB
                           + found.encoder_cache)
    outcome = run(deployment, "memory.fit")
    assert outcome.status == "pass", outcome.results
    assert (f"of which {vlm.encoder_parameter_count / 1e6:.2f}M vision encoder params"
            in outcome.summary)
    assert ("2.00 GiB processor cache (1 GiB --mm-processor-cache-gb x 2: API server and engine "
            "core)") in outcome.summary
    assert ("encoder cache (2048 tokens (vLLM's default max_num_batched_tokens) x width 128 "
            "(2 heads x 64) x 4 B float32)") in outcome.summary

    Deployment.objects.filter(pk=deployment.pk).update(
        extra_engine_args=["--max-num-batched-tokens", "4096"])
    deployment.refresh_from_db()
    assert estimate(deployment, worker).encoder_cache == 4096 * 128 * 4


def test_a_processor_cache_sized_by_the_plans_flags_is_what_runs_and_what_is_counted(
        tmp_path: Path, settings: Any, vlm: Variant) -> None:
    settings.DATA_DIR = tmp_path / "data"
    for given, counted in ((["--mm-processor-cache-gb", "0"], 0),
                           (["--mm-processor-cache-gb=0.5"], GIB)):
        deployment = vlm_plan(tmp_path, vlm, extra_engine_args=given)
        argv = {spec.slot: spec.argv for spec in process_specs(deployment)}["decode-0"]
        # The plan's own flag, once: pdserve adds no size of its own beside it.
        assert sum(a.startswith("--mm-processor-cache-gb") for a in argv) == 1
        assert given[0] in argv
        found = estimate(deployment, deployment.workers.get(role="decode"))
        assert found.processor_cache == counted
        Deployment.objects.filter(pk=deployment.pk).delete()


def test_memory_fit_fails_on_the_processor_cache_alone(tmp_path: Path, vlm: Variant) -> None:
    deployment = vlm_plan(tmp_path, vlm)
    node = local_node()
    # Room for two workers' weights, KV cache and runtime, not for their processor caches.
    workers = [estimate(deployment, w) for w in deployment.workers.all()]
    without = sum(e.total - e.processor_cache for e in workers)
    node.memory_bytes = int((without + GIB) / 0.9)
    node.save(update_fields=["memory_bytes"])
    outcome = run(deployment, "memory.fit")
    assert outcome.status == "error"
    assert "processor cache" in outcome.results[0].message
    # A plan that takes no image gives the workers no processor or encoder cache to hold.
    Deployment.objects.filter(pk=deployment.pk).update(max_images_per_prompt=0)
    assert run(deployment, "memory.fit").status == "pass"


def test_a_text_worker_holds_no_multimodal_memory(tmp_path: Path) -> None:
    deployment = make_plan(tmp_path)
    found = estimate(deployment, deployment.workers.get(role="decode"))
    assert (found.processor_cache, found.encoder_cache) == (0, 0)
    assert "processor cache" not in run(deployment, "memory.fit").summary


def test_a_vlm_plan_passes_every_check(tmp_path: Path, vlm: Variant) -> None:
    deployment = vlm_plan(tmp_path, vlm)
    for check in ("model.same_base", "model.path", "kv.geometry", "context.length",
                  "tokenizer.hash", "chat_template.hash", "multimodal.processor",
                  "multimodal.limits", "memory.fit"):
        outcome = run(deployment, check)
        assert outcome.status == "pass", (check, outcome.results)


def test_the_launch_spec_refuses_a_bad_image_limit() -> None:
    base = {"role": "colocated", "model_path": "/m", "served_model_name": "m", "port": 8100,
            "max_model_len": 2048}
    assert "--limit-mm-per-prompt" not in build_command(WorkerSpec(**base))[0]
    for limits in ({"image": -1}, {"image": True}, {"im age": 1}):
        with pytest.raises(LaunchError, match="mm_limits"):
            build_command(WorkerSpec(**base, mm_limits=limits))
