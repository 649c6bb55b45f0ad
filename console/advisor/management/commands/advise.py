"""``manage.py advise <deployment>``: the topology advice for a load (the default profile, a
synthetic one, or the router's recorded last hour or day), printed as ``manage.py up`` prints
it. ``--apply`` drafts the recommended topology and starts its rollout; ``--measure`` queues
the speed measurement the advice needs (run by the console's job worker)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.advisor import load_sources, services, speed_runs, topology_drafts
from console.advisor.forms import LoadForm
from console.advisor.predictions import subject
from console.advisor.summary import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_RATE_PER_S,
    advice_lines,
    topology_page,
)
from console.audit.actors import acting_as
from console.deployments.models import Deployment


def _flag(field: str) -> str:
    """The command's flag for a field of the page's load form."""
    return {"rate_per_s": "rate"}.get(field, field).replace("_", "-")


class Command(BaseCommand):
    help = "Print the topology advice of a deployment; --apply switches to it, --measure measures."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("deployment", help="the deployment's name")
        parser.add_argument("--window", choices=sorted(load_sources.WINDOWS),
                            help="the load the router recorded over the last hour or day "
                                 "(default: a synthetic profile)")
        parser.add_argument("--rate", type=float, default=DEFAULT_RATE_PER_S,
                            help="synthetic load: requests per second (default %(default)s)")
        parser.add_argument("--prompt-tokens", default=",".join(map(str, DEFAULT_PROMPT_TOKENS)),
                            help="synthetic load: prompt lengths drawn from (comma-separated)")
        parser.add_argument("--output-tokens", default=",".join(map(str, DEFAULT_OUTPUT_TOKENS)),
                            help="synthetic load: answer lengths drawn from (comma-separated)")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--apply", action="store_true",
                            help="draft the recommended topology and start its rollout")
        action.add_argument("--measure", action="store_true",
                            help="queue the speed measurement of the plan's variant on its node")
        parser.add_argument("--strategy", choices=("blue_green", "canary"), default="blue_green",
                            help="--apply: the rollout's strategy (default %(default)s)")
        parser.add_argument("--json", action="store_true", help="print the advice as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        deployment = Deployment.objects.filter(name=options["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment named {options['deployment']!r}")
        if options["measure"]:
            self._measure(deployment)
            return
        # The page's form checks the load, so a flag is refused for what the field would be.
        form = LoadForm({"window": options["window"]} if options["window"] else {
            "rate_per_s": options["rate"], "prompt_tokens": options["prompt_tokens"],
            "output_tokens": options["output_tokens"]})
        if not form.is_valid():
            field, messages = next(iter(services.form_errors(form).items()))
            raise CommandError(f"--{_flag(field)}: {'; '.join(messages)}")
        try:
            advice = services.advice_for(deployment, form)
        except load_sources.LoadUnavailable as exc:
            raise CommandError(f"--{_flag(exc.field)}: {exc}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(advice, indent=1))
        else:
            self.stdout.write("\n".join(advice_lines(deployment, advice,
                                                     topology_page(deployment))))
        if options["apply"]:
            self._apply(deployment, advice, options["strategy"])

    def _measure(self, deployment: Deployment) -> None:
        found = subject(deployment)
        if found is None:
            raise CommandError(f"{deployment.name}: the plan has no workers to measure")
        try:
            with acting_as("command", "advise"):
                profile = speed_runs.queue(found.node, found.variant, None)
        except speed_runs.MeasureRefused as exc:
            raise CommandError(f"{exc.field}: {exc}") from exc
        self.stdout.write(f"measurement #{profile.pk} of {found.variant} on {found.node.name} "
                          f"queued; its progress is on {topology_page(deployment)}")

    def _apply(self, deployment: Deployment, advice: dict[str, Any], strategy: str) -> None:
        try:
            with acting_as("command", "advise"):
                revision, rollout = topology_drafts.apply(deployment, advice, None, strategy)
        except topology_drafts.ApplyRefused as exc:
            raise CommandError(f"--apply: {exc}") from exc
        self.stdout.write(f"revision {revision.number} drafted ({advice['recommended']}); "
                          f"rollout #{rollout.pk} ({rollout.strategy}) started")
