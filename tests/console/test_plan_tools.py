"""The plan's tool-calling and template options (issue 12): stored, validated, passed to every
worker and the router, checked before a start; and degraded mode as a deployment state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.audit.models import AuditEntry
from console.catalog.models import BaseModel, Variant
from console.checks.tools import render_sample
from console.control import lifecycle
from console.control.daemon import Supervisor
from console.control.status import overall_state
from console.control.worker_specs import ProcessSpec, chat_template_path, process_specs
from console.deployments.models import Deployment
from console.fleet.discovery import engine_parsers
from console.fleet.services import local_node
from console.supervisor.models import ManagedProcess
from inference.launch import LaunchError, WorkerSpec, build_command
from inference.router.config import build_parser, config_from_args
from tests.console.sockets import free_port, listening, wait_for
from tests.console.test_plans import form_data, plan_body
from tests.console.test_supervisor import supervisor  # noqa: F401 - the fixture
from tests.console.tiny_models import make_plan, make_startable, register, run

pytestmark = pytest.mark.django_db

URL = "/api/v1/deployments/"
TOOLS_TEMPLATE = (Path(__file__).parents[1] / "e2e" / "hermes_tools.jinja").read_text()
TOOL_FIELDS = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True,
               "reasoning_parser": "deepseek_r1", "chat_template": TOOLS_TEMPLATE}


@pytest.fixture
def variant(tmp_path: Path) -> Variant:
    return register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


# ---- the plan's fields over REST and in the form ---------------------------------------------


def test_tool_options_are_stored_and_read_back(api: APIClient, variant: Variant) -> None:
    created = api.post(URL, plan_body(variant, **TOOL_FIELDS,
                                      router={"port": free_port(), "degraded_mode": False}),
                       format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert {key: body[key] for key in TOOL_FIELDS} == TOOL_FIELDS
    assert body["router"]["degraded_mode"] is False
    assert body["degraded"] is None
    checks = {c["id"]: c["status"] for c in body["checks"]["checks"]}
    assert checks["tools.parsers"] == "pass"
    assert checks["chat_template.override"] == "pass"


def test_defaults_are_no_tools_the_models_template_and_degraded_mode_on(
        api: APIClient, variant: Variant) -> None:
    body = api.post(URL, plan_body(variant), format="json").json()
    assert (body["tool_call_parser"], body["enable_auto_tool_choice"], body["chat_template"],
            body["reasoning_parser"]) == ("", False, "", "")
    assert body["router"]["degraded_mode"] is True


def test_auto_tool_choice_without_a_parser_is_400_naming_the_field(api: APIClient,
                                                                  variant: Variant) -> None:
    refused = api.post(URL, plan_body(variant, enable_auto_tool_choice=True), format="json")
    assert refused.status_code == 400
    assert "tool-call parser" in refused.json()["enable_auto_tool_choice"][0]
    assert not Deployment.objects.exists()

    created = api.post(URL, plan_body(variant), format="json").json()
    patched = api.patch(f"{URL}{created['id']}/", {"enable_auto_tool_choice": True},
                        format="json")
    assert patched.status_code == 400
    assert list(patched.json()) == ["enable_auto_tool_choice"]
    assert api.patch(f"{URL}{created['id']}/", {"enable_auto_tool_choice": True,
                                                "tool_call_parser": "hermes"},
                     format="json").status_code == 200


def test_a_parser_name_that_could_not_be_a_flag_value_is_400(api: APIClient,
                                                             variant: Variant) -> None:
    refused = api.post(URL, plan_body(variant, tool_call_parser="--model /etc"), format="json")
    assert refused.status_code == 400
    assert "tool_call_parser" in refused.json()


def test_the_form_saves_the_tool_options_and_the_page_shows_them(owner: User,
                                                                 variant: Variant) -> None:
    browser = Client()
    browser.force_login(owner)
    data = form_data(variant, local_node(), tool_call_parser="hermes",
                     enable_auto_tool_choice="on",
                     chat_template=TOOLS_TEMPLATE.replace("\n", "\r\n"))
    del data["degraded_mode"]  # an unticked box is not sent
    response = browser.post("/deployments/new/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    saved = Deployment.objects.get(name="tiny-form")
    assert (saved.tool_call_parser, saved.enable_auto_tool_choice, saved.degraded_mode) == (
        "hermes", True, False)
    assert saved.chat_template == TOOLS_TEMPLATE  # a browser's CRLF lines end in LF again
    html = browser.get("/deployments/tiny-form/").content.decode()
    assert "parser hermes; auto tool choice on" in html
    assert "off: 503 when a role has no ready worker" in html

    refused = browser.post("/deployments/new/", form_data(
        variant, local_node(), name="tiny-form-2", enable_auto_tool_choice="on"))
    assert refused.status_code == 400
    assert "needs a tool-call parser" in refused.content.decode()


def test_a_plan_edit_of_the_tool_options_is_audited(api: APIClient, variant: Variant) -> None:
    created = api.post(URL, plan_body(variant), format="json").json()
    api.patch(f"{URL}{created['id']}/", {"tool_call_parser": "pythonic",
                                         "router": {"degraded_mode": False}}, format="json")
    entry = AuditEntry.objects.filter(action="deployment.edit").latest("pk")
    assert entry.changes["tool_call_parser"] == ["", "pythonic"]
    assert entry.changes["degraded_mode"] == [True, False]


# ---- launch: every worker and the router -----------------------------------------------------


def test_every_worker_and_the_router_get_the_options_and_one_template_file(
        tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"
    settings.PDSERVE_KV_DIR = tmp_path / "kv"
    deployment = make_plan(tmp_path, **TOOL_FIELDS, degraded_mode=False)
    specs = {spec.slot: spec for spec in process_specs(deployment)}
    template = chat_template_path(deployment)
    assert template == tmp_path / "data" / "templates" / "tiny-1p1d.jinja"
    assert template.read_text() == TOOLS_TEMPLATE
    for slot in ("prefill-0", "decode-0"):
        argv = specs[slot].argv
        assert flag_values(argv, "--tool-call-parser") == ["hermes"]
        assert "--enable-auto-tool-choice" in argv
        assert flag_values(argv, "--chat-template") == [str(template)]
        assert flag_values(argv, "--reasoning-parser") == ["deepseek_r1"]
    router = specs["router"].argv
    assert flag_values(router, "--chat-template") == [str(template)]
    assert "--no-degraded-mode" in router
    # The router itself takes what the console passes.
    config = config_from_args(build_parser().parse_args(router[3:]))
    assert (config.chat_template, config.degraded_mode) == (str(template), False)
    # Nothing changed: the file is not rewritten (this runs on every supervisor tick).
    before = template.stat().st_mtime_ns
    process_specs(deployment)
    assert template.stat().st_mtime_ns == before
    assert [p.name for p in template.parent.iterdir()] == ["tiny-1p1d.jinja"]  # no temporaries


def test_deleting_the_deployment_removes_its_template_file(
        tmp_path: Path, settings: Any,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    settings.DATA_DIR = tmp_path / "data"
    deployment = make_plan(tmp_path, chat_template=TOOLS_TEMPLATE)
    process_specs(deployment)
    assert chat_template_path(deployment).is_file()
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.delete(deployment)
    assert not chat_template_path(deployment).exists()


def test_a_plan_without_options_passes_none_of_the_flags(tmp_path: Path, settings: Any) -> None:
    settings.DATA_DIR = tmp_path / "data"
    specs = process_specs(make_plan(tmp_path))
    for spec in specs:
        for flag in ("--tool-call-parser", "--enable-auto-tool-choice", "--chat-template",
                     "--reasoning-parser", "--no-degraded-mode"):
            assert flag not in spec.argv, (spec.slot, flag)
    assert not (tmp_path / "data" / "templates").exists()


def test_the_launch_spec_refuses_auto_tool_choice_without_a_parser() -> None:
    spec = WorkerSpec(role="colocated", model_path="/m", served_model_name="m", port=8100,
                      max_model_len=2048, enable_auto_tool_choice=True)
    with pytest.raises(LaunchError, match="enable_auto_tool_choice"):
        build_command(spec)
    with pytest.raises(LaunchError, match="chat_template_path"):
        build_command(WorkerSpec(role="colocated", model_path="/m", served_model_name="m",
                                 port=8100, max_model_len=2048, chat_template_path="t.jinja"))


# ---- checks ----------------------------------------------------------------------------------


def test_the_installed_vllms_parsers_are_read_without_importing_it() -> None:
    node = local_node()
    tool_parsers = engine_parsers("tool_call", node.engine_package, node.engine_version)
    assert tool_parsers is not None and {"hermes", "llama3_json", "pythonic", "mistral"} <= tool_parsers
    reasoning = engine_parsers("reasoning", node.engine_package, node.engine_version)
    assert reasoning is not None and "deepseek_r1" in reasoning
    assert engine_parsers("tool_call", "", "") is None
    # Whether reading imported vLLM is asked of a fresh interpreter: in this one, another test
    # may have imported vLLM already.
    probe = ("import sys; from console.fleet.discovery import engine_parsers; "
             f"names = engine_parsers('tool_call', {node.engine_package!r}, "
             f"{node.engine_version!r}); "
             "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).parents[2],
                         capture_output=True, text=True, check=True).stdout.split(maxsplit=1)
    assert int(out[0]) == len(tool_parsers)
    assert out[1].strip() == "[]"


def test_an_unknown_parser_is_an_error_naming_the_field(tmp_path: Path) -> None:
    deployment = make_startable(make_plan(tmp_path, tool_call_parser="hermess",
                                          enable_auto_tool_choice=True, reasoning_parser="nope"))
    outcome = run(deployment, "tools.parsers")
    assert outcome.status == "error"
    messages = [r.message for r in outcome.results]
    assert any(m.startswith("tool_call_parser: 'hermess' is not a tool-call parser") and
               "hermes" in m for m in messages), messages
    assert any(m.startswith("reasoning_parser: 'nope'") for m in messages), messages
    assert all("choose one of vLLM's names" in r.hint for r in outcome.results)


def test_auto_tool_choice_without_a_parser_fails_the_check_too(tmp_path: Path) -> None:
    # The plan writers refuse it; a plan changed around them still is not started so.
    deployment = make_startable(make_plan(tmp_path))
    Deployment.objects.filter(pk=deployment.pk).update(enable_auto_tool_choice=True)
    outcome = run(deployment, "tools.parsers")
    assert outcome.status == "error"
    assert "enable_auto_tool_choice" in outcome.results[0].message


def test_a_parser_without_auto_tool_choice_is_a_warning(tmp_path: Path) -> None:
    deployment = make_startable(make_plan(tmp_path, tool_call_parser="hermes"))
    outcome = run(deployment, "tools.parsers")
    assert outcome.status == "warning"
    [result] = outcome.results
    assert "vLLM loads the parser only with --enable-auto-tool-choice" in result.message


@pytest.mark.parametrize(("template", "wanted"), [
    ("{% for m in messages %}{{ m.content }", "invalid Jinja: line 1"),
    ("{{ raise_exception('no system role here') }}", "no system role here"),
    ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", "invalid Jinja"),
    ("<|im_start|>assistant\n", "renders the sample conversation without"),
])
def test_a_broken_override_template_is_an_error_naming_the_field(
        tmp_path: Path, template: str, wanted: str) -> None:
    deployment = make_startable(make_plan(tmp_path, chat_template=template))
    outcome = run(deployment, "chat_template.override")
    assert outcome.status == "error"
    [result] = outcome.results
    assert result.message.startswith("chat_template: ")
    assert wanted in result.message, result.message
    assert "chat_template field" in result.hint


def test_a_tool_parser_with_a_template_that_ignores_tools_is_a_warning(tmp_path: Path) -> None:
    plain = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    deployment = make_startable(make_plan(tmp_path, chat_template=plain,
                                          tool_call_parser="hermes"))
    outcome = run(deployment, "chat_template.override")
    assert outcome.status == "warning"
    assert "tools" in outcome.results[0].hint


def test_the_tools_template_renders_tools_and_calls() -> None:
    rendered = render_sample(TOOLS_TEMPLATE, tools=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


def test_an_override_makes_differing_model_templates_equal(tmp_path: Path) -> None:
    deployment = make_startable(make_plan(tmp_path))
    other = register(deployment.base_model, tmp_path, "other",
                     chat_template="{{ messages[0].content }}")
    deployment.workers.filter(role="decode").update(variant=other)
    outcome = run(deployment, "chat_template.hash")
    assert outcome.status == "error"
    assert "router (as decode-0)" in outcome.results[0].message
    Deployment.objects.filter(pk=deployment.pk).update(chat_template=TOOLS_TEMPLATE)
    outcome = run(deployment, "chat_template.hash")
    assert outcome.status == "pass"
    assert outcome.summary.startswith("the plan's own for every worker and the router")


# ---- degraded mode as a state ----------------------------------------------------------------

# Answers /health 200 with the JSON body in the file named by argv[2], read per request.
JSON_HEALTH_SERVER = """
import http.server, pathlib, sys
port, body_file = int(sys.argv[1]), pathlib.Path(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = body_file.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_a_router_answering_degraded_makes_the_deployment_degraded(
        supervisor: Supervisor, tmp_path: Path, owner: User, api: APIClient) -> None:  # noqa: F811
    deployment = make_plan(tmp_path, desired_state=Deployment.DesiredState.RUNNING)
    body = tmp_path / "health.json"
    body.write_text(json.dumps({"status": "degraded", "degraded": "prefill", "roles": {}}))
    port = free_port()
    supervisor._spawn(deployment, ProcessSpec(
        slot="router", role="router", port=port,
        argv=[sys.executable, "-c", JSON_HEALTH_SERVER, str(port), str(body)]))
    child = supervisor._child_for(deployment.pk, "router")
    assert child is not None
    wait_for(lambda: listening(port), "the router's health server")
    assert supervisor.check_health() is True
    router = ManagedProcess.objects.get(deployment=deployment, slot="router")
    assert (router.state, router.degraded) == (ManagedProcess.State.READY, "prefill")
    # The prefill worker is down (no row), decode runs: the router serves, degraded.
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                  state=ManagedProcess.State.READY, log_path=str(tmp_path / "l"))
    assert overall_state(deployment, list(deployment.processes.all())) == "degraded"

    read = api.get(f"{URL}{deployment.pk}/").json()
    assert (read["state"], read["degraded"]) == ("degraded", "prefill")
    assert {p["slot"]: p["degraded"] for p in read["processes"]}["router"] == "prefill"
    browser = Client()
    browser.force_login(owner)
    html = browser.get(f"/deployments/{deployment.name}/processes/").content.decode()
    assert 'id="deployment-state">degraded<' in html
    assert "no prefill worker is ready" in html

    body.write_text(json.dumps({"status": "ok", "roles": {}}))
    child.next_probe = 0.0
    assert supervisor.check_health() is True
    router.refresh_from_db()
    assert router.degraded == ""
    assert overall_state(deployment, list(deployment.processes.all())) != "degraded"
