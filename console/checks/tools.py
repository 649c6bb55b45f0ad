"""tools.parsers and chat_template.override: the plan's tool calling and its own chat template.

vLLM checks a parser name only once the model is loaded (a minute or more here) and a template
only when the first chat request comes, with a 400 or 500 to that client; these checks say it
before anything starts.
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateSyntaxError

from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView, node_names, who
from console.fleet.discovery import engine_parsers

# The plan fields, the vLLM flags they become, and the registry each name must be in.
PARSER_FIELDS = (("tool_call_parser", "--tool-call-parser", "tool_call"),
                 ("reasoning_parser", "--reasoning-parser", "reasoning"))
# Names that fit vLLM 0.32's parsers without special tokens in the vocabulary; the hint offers
# them when a name is unknown.
SUGGESTED = {"tool_call": "hermes, llama3_json, pythonic, mistral",
             "reasoning": "deepseek_r1, qwen3, mistral"}

WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
SAMPLE_CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And the weather there?"},
]
# A tool call and its answer, as vLLM passes them to the template (arguments as a dict).
SAMPLE_TOOL_TURNS: list[dict[str, Any]] = [
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "clear"}'},
]


@check("tools.parsers", "tool-call and reasoning parsers exist in each node's vLLM")
def parsers(plan: PlanView) -> Verdict:
    deployment = plan.deployment
    findings: list[Finding] = []
    if deployment.enable_auto_tool_choice and not deployment.tool_call_parser:
        findings.append(error(
            'enable_auto_tool_choice is on but tool_call_parser is empty: vLLM refuses to start '
            "a worker so, since it cannot read tool calls out of the model's text without one",
            "set tool_call_parser (e.g. hermes), or turn auto tool choice off"))
    if deployment.tool_call_parser and not deployment.enable_auto_tool_choice:
        # vLLM 0.32 builds no tool parser without --enable-auto-tool-choice
        # (parser/parser_manager.py), and then refuses every tool_choice but "none".
        findings.append(warning(
            f"tool_call_parser is {deployment.tool_call_parser} but auto tool choice is off: "
            "vLLM loads the parser only with --enable-auto-tool-choice, so every request with "
            'tools and tool_choice "auto", "required" or a named tool is refused with 400',
            "turn auto tool choice on, or empty tool_call_parser"))
    wanted = [(name, flag, kind, getattr(deployment, name))
              for name, flag, kind in PARSER_FIELDS if getattr(deployment, name)]
    if not wanted:
        return Verdict(findings, "no tool-call or reasoning parser")
    nodes = {w.node_id: w.node for w in plan.workers}
    for node in nodes.values():
        workers = [w for w in plan.workers if w.node_id == node.pk]
        if not plan.is_local(node):
            findings.append(warning(
                f"{who(workers, plan)}: {node_names(workers)} is not this machine; pdserve "
                "cannot read which parsers its vLLM has (node agents come later)",
                f"make sure vLLM {node.engine_version or deployment.engine_version} there has "
                + ", ".join(f"the {kind.replace('_', '-')} parser {value!r}"
                            for _, _, kind, value in wanted)))
            continue
        for name, flag, kind, value in wanted:
            known = engine_parsers(kind, node.engine_package, node.engine_version)
            if known is None:
                findings.append(warning(
                    f"{name}: cannot read the {kind.replace('_', '-')} parsers of "
                    f"{node_names(workers)}'s vLLM ({node.engine_version or 'none installed'}) "
                    f"to check {value!r}",
                    f"run `vllm serve --help` there and look for {value!r} under {flag}"))
            elif value not in known:
                close = sorted(k for k in known if value.lower()[:4] in k.lower())
                findings.append(error(
                    f"{name}: {value!r} is not a {kind.replace('_', '-')} parser of vLLM "
                    f"{node.engine_version} on {node_names(workers)}; it has {len(known)}"
                    + (f", e.g. {', '.join(close[:6])}" if close else ""),
                    f"choose one of vLLM's names (e.g. {SUGGESTED[kind]}), or empty the field"))
    summary = "; ".join(f"{name} {value}" for name, _, _, value in wanted)
    if deployment.enable_auto_tool_choice:
        summary += "; auto tool choice on"
    return Verdict(findings, summary)


@check("chat_template.override", "the plan's chat template is valid Jinja and renders a chat")
def chat_template_override(plan: PlanView) -> Verdict:
    template = plan.deployment.chat_template
    if not template:
        return Verdict(summary="none: every worker uses its model's own template")
    fix = "fix the plan's chat_template field (empty it to use the model's own template)"
    tools = bool(plan.deployment.tool_call_parser)
    try:
        rendered = render_sample(template, tools)
    except Exception as exc:
        # A template can raise anything (its own raise_exception, a TypeError in a filter):
        # each is this check's finding, named, not the check's own failure.
        return Verdict([error(f"chat_template: {describe_failure(exc)}", fix)])
    missing = [m["content"] for m in SAMPLE_CHAT if m["content"] not in rendered]
    if missing:
        return Verdict([error(
            f"chat_template: renders the sample conversation without {missing[0]!r} "
            f"({len(rendered)} characters out)",
            "render every message's content (loop over `messages`); " + fix)])
    findings: list[Finding] = []
    if tools and "get_weather" not in rendered:
        findings.append(warning(
            "chat_template: a tool-call parser is set, but the template renders neither the "
            "request's tools nor earlier tool calls, so the model never sees them",
            "render `tools` (e.g. in the system turn) and each message's `tool_calls`"))
    summary = f"{len(template)} characters, renders the sample chat"
    return Verdict(findings, summary + (" with tools" if tools else ""))


def render_sample(template: str, tools: bool) -> str:
    """The template rendered as vLLM renders a chat request (transformers' Jinja sandbox), with
    a sample conversation; with ``tools``, a tool, a call of it and its answer as well."""
    # transformers takes over a second to import; only plans with their own template pay it.
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [*SAMPLE_CHAT, *SAMPLE_TOOL_TURNS] if tools else SAMPLE_CHAT
    rendered, _ = render_jinja_template(
        conversations=[messages], tools=[WEATHER_TOOL] if tools else None,
        chat_template=template, add_generation_prompt=True,
        bos_token="<s>", eos_token="</s>")
    return rendered[0]


def describe_failure(exc: Exception) -> str:
    """'line 3: unexpected '}'' for a syntax error, the exception's words otherwise."""
    line = getattr(exc, "lineno", None)
    where = f"line {line}: " if line else ""
    kind = ("invalid Jinja" if isinstance(exc, TemplateSyntaxError)
            else f"rendering a sample chat failed ({type(exc).__name__})")
    return f"{kind}: {where}{exc}"
