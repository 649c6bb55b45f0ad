"""The gateway's configuration (inference/gateway/config.py): what it is made of, and each way
it can be wrong refused with the JSON path of the offending field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from inference.gateway.config import Alias, Deployment, GatewayConfig, load_config_file, parse_config
from inference.router.errors import RequestError
from inference.router.keys import key_hash

KEY = "pds_ab12cd34_" + "s" * 43
VALID: dict[str, Any] = {
    "version": "3f2a", "require_key": True,
    "deployments": [
        {"name": "smollm2", "served_model_name": "smollm2-135m", "router": "http://127.0.0.1:8080/",
         "state": "running", "team": "default", "require_key": True},
        {"name": "other", "served_model_name": "other-model", "router": None, "state": "stopped",
         "team": "ml", "require_key": False, "unknown_field": "ignored"},
    ],
    "aliases": [{"name": "chat", "targets": ["smollm2", "other"]}],
    "keys": [{"id": 3, "prefix": "ab12cd34", "hash": key_hash(KEY).upper(), "state": "active",
              "deployments": ["smollm2"]}],
}


def test_a_valid_configuration() -> None:
    config = parse_config(VALID)
    assert config.version == "3f2a" and config.require_key
    # The router's base URL loses its trailing slash: request paths are appended to it.
    assert config.deployments == (
        Deployment("smollm2", "smollm2-135m", "http://127.0.0.1:8080", "running", "default", True),
        Deployment("other", "other-model", None, "stopped", "ml", False))
    assert config.aliases == (Alias("chat", ("smollm2", "other")),)
    [key] = config.keys
    assert (key.id, key.hash, key.deployments) == ("3", key_hash(KEY), frozenset({"smollm2"}))
    assert parse_config({"deployments": []}) == GatewayConfig()
    # A deployment's require_key is the configuration's unless it says otherwise.
    data = copy.deepcopy(VALID)
    del data["deployments"][0]["require_key"]
    for require_key in (True, False):
        data["require_key"] = require_key
        assert parse_config(data).deployments[0].require_key is require_key


def changed(path: str, value: Any) -> dict[str, Any]:
    """VALID with the field at ``path`` (dots and [index]) set to ``value``, or removed when
    ``value`` is ``...``."""
    data = copy.deepcopy(VALID)
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    last_key: Any = int(last) if last.isdigit() else last
    if value is ...:
        del node[last_key]
    else:
        node[last_key] = value
    return data


@pytest.mark.parametrize(("path", "value", "param"), [
    ("version", 3, "version"),
    ("require_key", "yes", "require_key"),
    ("deployments", ..., "deployments"),
    ("deployments[1]", "other", "deployments[1]"),
    ("deployments[1].name", "smollm2", "deployments[1].name"),
    ("deployments[1].name", "", "deployments[1].name"),
    ("deployments[0].router", ..., "deployments[0].router"),
    ("deployments[0].router", "127.0.0.1:8080", "deployments[0].router"),
    ("deployments[0].router", "http://127.0.0.1:8080/v1", "deployments[0].router"),
    ("deployments[0].router", "ftp://127.0.0.1", "deployments[0].router"),
    ("deployments[0].state", None, "deployments[0].state"),
    ("deployments[1].team", ..., "deployments[1].team"),
    ("deployments[1].require_key", "no", "deployments[1].require_key"),
    ("aliases", {}, "aliases"),
    ("aliases[0].name", "other-model", "aliases[0].name"),
    ("aliases[0].targets", [], "aliases[0].targets"),
    ("aliases[0].targets[1]", "nope", "aliases[0].targets[1]"),
    ("aliases[0].targets[1]", "smollm2", "aliases[0].targets[1]"),
    ("keys[0].id", True, "keys[0].id"),
    ("keys[0].prefix", "ab12_d34", "keys[0].prefix"),
    ("keys[0].hash", "00" * 31 + "zz", "keys[0].hash"),
    ("keys[0].state", "out_of_scope", "keys[0].state"),
    ("keys[0].deployments", "smollm2", "keys[0].deployments"),
    ("keys[0].deployments[0]", "ghost", "keys[0].deployments[0]"),
])
def test_each_wrong_field_is_named(path: str, value: Any, param: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_config(changed(path, value))
    assert refused.value.status == 400
    assert refused.value.param == param, refused.value.message


def test_repeated_aliases_and_key_prefixes_are_refused() -> None:
    data = copy.deepcopy(VALID)
    data["aliases"].append({"name": "chat", "targets": ["other"]})
    data["keys"].append({**data["keys"][0], "id": 4})
    with pytest.raises(RequestError) as refused:
        parse_config(data)
    assert refused.value.param == "aliases[1].name"
    del data["aliases"][1]
    with pytest.raises(RequestError) as refused:
        parse_config(data)
    assert refused.value.param == "keys[1].prefix"


def test_a_config_file_error_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    with pytest.raises(ValueError, match="--config-file: cannot read"):
        load_config_file(path)
    path.write_text(json.dumps(changed("aliases[0].targets[1]", "nope")))
    with pytest.raises(ValueError, match=r"--config-file: .* \(at aliases\[0\]\.targets\[1\]\)"):
        load_config_file(path)
    path.write_text(json.dumps(VALID))
    assert load_config_file(path) == parse_config(VALID)
