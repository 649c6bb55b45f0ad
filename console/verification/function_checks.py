"""Function: a plain completion; a multi-turn streamed chat, each turn complete; greedy output
through the router against the output gate's reference answers, when there are any; an image
request, when the model takes images (console/verification/image_check.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from django.conf import settings

from console.deployments.models import Deployment
from console.quality import services as gates
from console.quality.models import GateResult
from console.verification.image_check import image_request
from console.verification.streaming import stream
from console.verification.subject import Subject
from console.verification.verdicts import FAIL, PASS, WARN, Section
from inference.output_gate import DEFAULT_MAX_TOKENS, GateError, ReferenceAnswer, load_prompts
from inference.reference_cache import ReferenceAnswers
from inference.worker_auth import bearer

TIMEOUT_S = 120.0
TURNS = ("Name one colour.", "Why that one?", "Say it again, in one word.")
# The system prompt keeps a small model's greedy answers from rambling (README, make up).
SYSTEM = "You are a helpful assistant. Answer in one short sentence."


def plain_completion(subject: Subject, section: Section, client: httpx.Client) -> None:
    body = {"model": subject.model, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}
    try:
        response = client.post(f"{subject.router_url}/v1/completions", json=body,
                               headers=bearer(subject.api_key))
    except httpx.HTTPError as exc:
        section.add("plain completion", FAIL, f"completion: {type(exc).__name__}: {exc}")
        return
    if response.status_code != 200:
        section.add("plain completion", FAIL,
                    f"completion answered {response.status_code}: {response.text[:200]}")
        return
    answer = response.json()
    choice = (answer.get("choices") or [{}])[0]
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    verdict = PASS if tokens and choice.get("finish_reason") else FAIL
    section.add("plain completion", verdict,
                f"completion: {tokens} tokens, finish_reason {choice.get('finish_reason')}",
                text=str(choice.get("text", ""))[:200], completion_tokens=tokens)


def dialogue(subject: Subject, section: Section) -> None:
    """Three turns, each streamed with the conversation so far."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    turns: list[dict[str, Any]] = []
    url = f"{subject.router_url}/v1/chat/completions"

    async def talk() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=5.0)) as client:
            for question in TURNS:
                messages.append({"role": "user", "content": question})
                outcome = await stream(client, url, {
                    "model": subject.model, "messages": list(messages), "max_tokens": 24,
                    "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                }, bearer(subject.api_key))
                turns.append({"question": question, "ok": outcome.ok, "error": outcome.error,
                              "finish_reason": outcome.finish_reason, "answer": outcome.text[:200],
                              "events": outcome.events, "output_tokens": outcome.output_tokens})
                if not outcome.ok:
                    return
                messages.append({"role": "assistant", "content": outcome.text})

    asyncio.run(talk())
    broken = [t for t in turns if not t["ok"] or not t["finish_reason"]]
    empty = [t for t in turns if t["ok"] and not t["answer"].strip()]
    if broken or len(turns) < len(TURNS):
        first = broken[0] if broken else turns[-1]
        section.add("multi-turn dialogue", FAIL,
                    f"turn {turns.index(first) + 1} of {len(TURNS)}: "
                    f"{first['error'] or 'no finish_reason'}", turns=turns)
    elif empty:
        section.add("multi-turn dialogue", WARN,
                    f"{len(empty)} of {len(TURNS)} turns answered with no text", turns=turns)
    else:
        section.add("multi-turn dialogue", PASS,
                    f"{len(TURNS)} streamed turns complete, each with a finish_reason",
                    turns=turns)


Reference = tuple[GateResult | None, list[str], list[ReferenceAnswer] | None, str]


def _reference(deployment: Deployment) -> Reference:
    """(the latest finished gate, its prompts, the reference's kept answers, why none)."""
    gate = deployment.gate_results.filter(
        state__in=(GateResult.State.PASSED, GateResult.State.FAILED)).first()
    if gate is None:
        return None, [], None, "no output gate result for this deployment"
    variant = gates.reference_variant(deployment)
    if variant is None:
        return gate, [], None, f"{deployment.base_model.name} has no unquantized variant"
    try:
        prompts = load_prompts(gate.prompts)
        kept = ReferenceAnswers(settings.PDSERVE_CACHE_DIR, variant.path, dtype=deployment.dtype,
                                enforce_eager=settings.PDSERVE_ENFORCE_EAGER,
                                max_tokens=DEFAULT_MAX_TOKENS)
    except (GateError, RuntimeError, OSError) as exc:
        return gate, [], None, f"the reference answers cannot be read: {exc}"
    answers = kept.get(prompts)
    return gate, prompts, answers, "" if answers else "the gate's reference answers are not kept"


def greedy_against_reference(deployment: Deployment, subject: Subject, section: Section,
                             client: httpx.Client) -> None:
    gate, prompts, answers, why = _reference(deployment)
    if gate is None or answers is None:
        section.add("greedy output", WARN, f"no reference: {why}")
        return
    rows: list[dict[str, Any]] = []
    matched = total = 0
    for prompt, answer in zip(prompts, answers, strict=True):
        response = client.post(f"{subject.router_url}/v1/completions", headers=bearer(
            subject.api_key), json={"model": subject.model, "prompt": answer.prompt_ids,
                                    "max_tokens": len(answer.answer_ids), "temperature": 0,
                                    "ignore_eos": True, "return_token_ids": True})
        if response.status_code != 200:
            section.add("greedy output", FAIL, f"greedy completion answered "
                        f"{response.status_code}: {response.text[:200]}")
            return
        got = [int(i) for i in ((response.json().get("choices") or [{}])[0].get("token_ids") or [])]
        same = 0
        for mine, theirs in zip(got, answer.answer_ids, strict=False):
            if mine != theirs:
                break
            same += 1
        matched += same
        total += len(answer.answer_ids)
        rows.append({"prompt": prompt[:80], "equal": got == answer.answer_ids,
                     "same_prefix_tokens": same, "tokens": len(answer.answer_ids)})
    agreement = matched / total if total else 0.0
    differing = [r for r in rows if not r["equal"]]
    evidence = {"gate": gate.pk, "agreement": round(agreement, 4), "prompts": rows}
    if not differing:
        section.add("greedy output", PASS, f"greedy output equals the reference on all "
                    f"{len(rows)} prompts (gate #{gate.pk})", **evidence)
    elif agreement >= gate.min_agreement:
        section.add("greedy output", WARN, f"greedy output differs from the reference on "
                    f"{len(differing)} of {len(rows)} prompts (token agreement {agreement:.2f})",
                    **evidence)
    else:
        section.add("greedy output", FAIL, f"greedy output agrees with the reference on "
                    f"{agreement:.2f} of its tokens, below the gate's {gate.min_agreement}",
                    **evidence)


def function(deployment: Deployment, subject: Subject) -> Section:
    section = Section("function")
    with httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, connect=5.0)) as client:
        plain_completion(subject, section, client)
        dialogue(subject, section)
        try:
            greedy_against_reference(deployment, subject, section, client)
        except httpx.HTTPError as exc:
            section.add("greedy output", FAIL, f"greedy completion: {type(exc).__name__}: {exc}")
        image_request(subject, section, client)
    return section
