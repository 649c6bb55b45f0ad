"""The router's settings, all made from RouterConfig's fields: the parser offers each field that
is not read from the environment, with its help, default and choices; bounds and choices are
enforced with a message that names the flag."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from inference.router.config import RouterConfig, build_parser, config_from_args, settings

MINIMAL_ARGV = ["--served-model-name", "m", "--tokenizer", "/m", "--max-model-len", "128",
                "--prefill", "http://p:1", "--decode", "http://d:2"]
VALID: dict[str, Any] = {"served_model_name": "m", "tokenizer_path": "/m", "max_model_len": 128,
                         "prefill_urls": ("http://p:1",), "decode_urls": ("http://d:2",)}
# Written down before the settings moved into the dataclass's fields; the console passes these.
FLAGS = ["--served-model-name", "--tokenizer", "--max-model-len", "--prefill", "--decode", "--colocated",
         "--revision", "--kv-channel", "--host", "--port", "--request-timeout", "--connect-timeout",
         "--health-interval", "--chat-template",
         "--max-body-bytes", "--tokenize-threads", "--tokenize-queue",
         "--local-prefill-max-tokens", "--prefill-policy",
         "--decode-policy", "--colocated-policy", "--pd-policy", "--stall-budget-ms", "--no-degraded-mode",
         "--prefill-slots",
         "--breaker-failures", "--breaker-cooldown", "--prefix-block-size", "--prefix-blocks",
         "--kv-warmup-tokens", "--kv-lease-s", "--keys-file", "--usage-file",
         "--max-images", "--max-image-bytes", "--max-image-pixels", "--media-path", "--media-domain",
         "--media-fetch-timeout"]
ENVIRONMENT = ["PDSERVE_API_KEY", "PDSERVE_ROUTER_ADMIN_TOKEN", "PDSERVE_WORKER_KEY", "REDIS_URL"]


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.option_strings[0]: action for action in parser._actions if action.dest != "help"}


def test_the_flags_are_the_ones_the_router_always_had() -> None:
    assert list(actions(build_parser())) == FLAGS


def test_every_field_is_a_flag_with_its_help_or_read_from_the_environment() -> None:
    parser = build_parser()
    by_flag = actions(parser)
    for f, spec in settings():
        assert spec.help, f.name
        if spec.env:
            assert spec.env in ENVIRONMENT
            assert f"{spec.env}\n" in parser.format_help()
            assert not any(action.dest == f.name for action in by_flag.values()), f.name
            continue
        action = by_flag[spec.name(f.name)]
        assert action.dest == f.name
        assert action.help == spec.help
        assert action.required == (f.default is dataclasses.MISSING)
        if spec.choices:
            assert list(action.choices or ()) == list(spec.choices)
    help_text = " ".join(parser.format_help().split())
    for _, spec in settings():
        assert " ".join(spec.help.split()) in help_text


def test_the_parser_defaults_are_the_dataclass_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert config_from_args(build_parser().parse_args(MINIMAL_ARGV)) == RouterConfig(**VALID)


def test_numbers_are_parsed_with_the_field_types() -> None:
    args = build_parser().parse_args([*MINIMAL_ARGV, "--port", "9000", "--request-timeout", "1.5"])
    config = config_from_args(args)
    assert (config.port, config.request_timeout_s) == (9000, 1.5)
    assert config.decode_urls == ("http://d:2",)


@pytest.mark.parametrize(("argv", "flag"), [
    (["--port", "eighty"], "--port"),
    (["--kv-channel", "carrier-pigeon"], "--kv-channel"),
    (["--pd-policy", "sometimes"], "--pd-policy"),
    (["--breaker-cooldown", "soon"], "--breaker-cooldown"),
])
def test_the_parser_refuses_a_bad_value_naming_the_flag(
        argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*MINIMAL_ARGV, *argv])
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "message"), [
    ({"max_model_len": 0}, "--max-model-len: must be positive, got 0"),
    ({"port": 0}, "--port: must be at least 1 and at most 65535, got 0"),
    ({"port": 65536}, "--port: must be at least 1 and at most 65535, got 65536"),
    ({"local_prefill_max_tokens": -1}, "--local-prefill-max-tokens: must be at least 0, got -1"),
    ({"stall_budget_ms": 0.0}, "--stall-budget-ms: must be positive, got 0.0"),
    ({"prefill_slots": 0}, "--prefill-slots: must be at least 1, got 0"),
    ({"breaker_failures": 0}, "--breaker-failures: must be at least 1, got 0"),
    ({"breaker_cooldown_s": -1.0}, "--breaker-cooldown: must be positive, got -1.0"),
    ({"prefix_block_size": 0}, "--prefix-block-size: must be positive, got 0"),
    ({"prefix_blocks": 0}, "--prefix-blocks: must be positive, got 0"),
    ({"kv_channel": "pigeon"}, "--kv-channel: unknown 'pigeon' (one of nixl, shared-storage)"),
    ({"decode_policy": "fastest"}, "--decode-policy: unknown 'fastest' (one of round_robin, "),
    ({"pd_policy": "sometimes"}, "--pd-policy: unknown 'sometimes' (one of remote, pd_adaptive)"),
    ({"redis_url": "http://cache"}, "REDIS_URL: scheme must be redis://"),
])
def test_bounds_and_choices_are_enforced_naming_the_setting(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        RouterConfig(**{**VALID, **overrides}).validate()
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("overrides", [
    {"port": 1}, {"port": 65535}, {"local_prefill_max_tokens": 0}, {"prefill_slots": 1},
    {"breaker_failures": 1}, {"max_model_len": 1}, {"stall_budget_ms": 0.5},
])
def test_the_bounds_themselves_are_accepted(overrides: dict[str, Any]) -> None:
    RouterConfig(**{**VALID, **overrides}).validate()


def test_a_bad_value_on_the_command_line_is_refused_naming_the_flag() -> None:
    args = build_parser().parse_args([*MINIMAL_ARGV, "--stall-budget-ms", "0"])
    with pytest.raises(ValueError, match="^--stall-budget-ms: must be positive"):
        config_from_args(args)


def test_the_help_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--breaker-cooldown BREAKER_COOLDOWN_S" in out and "environment:" in out
