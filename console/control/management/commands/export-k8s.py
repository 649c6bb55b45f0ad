"""``manage.py export-k8s DEPLOYMENT``: the deployment's plan as Kubernetes manifests;
``manage.py export-k8s --gateway``: the gateway in front of every deployment's router.

Prints one multi-document YAML file, or writes it to ``DIR/<deployment>.yaml`` (``DIR/
gateway.yaml``) with ``--out``. What the objects hold, and what the user provides beside them,
is console/control/k8s_manifests.py's (k8s_gateway.py's) to say; the file's header lists the
latter.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.control import k8s_gateway, k8s_manifests, k8s_objects
from console.deployments.models import Deployment

# A namespace is a DNS label (RFC 1123).
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# An image reference has no whitespace; the registry judges the rest when it pulls.
IMAGE = re.compile(r"\S+")


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


class Command(BaseCommand):
    help = "Write a deployment's plan as Kubernetes manifests (multi-document YAML)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("deployment", metavar="DEPLOYMENT", nargs="?",
                            help="the deployment's name")
        parser.add_argument("--gateway", action="store_true",
                            help="instead of a deployment: the gateway, PDSERVE_GATEWAY_REPLICAS "
                                 "pods behind one Service, routing to every deployment's router "
                                 "Service")
        parser.add_argument("--out", type=Path, metavar="DIR",
                            help="write DIR/<deployment>.yaml (DIR is made when missing); "
                                 "default: print to stdout")
        parser.add_argument("--namespace", default="default",
                            help="the namespace of every object (default: default)")
        parser.add_argument("--image", default=k8s_objects.DEFAULT_IMAGE,
                            help="an image with pdserve and vLLM, run by the workers and the "
                                 f"router (default: {k8s_objects.DEFAULT_IMAGE})")
        parser.add_argument("--gpus-per-node", type=positive, metavar="N",
                            help="GPUs of one Kubernetes node: an instance needing more spans "
                                 "several pods (a LeaderWorkerSet); default: the plan's nodes, "
                                 "on which each instance fits")

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = options["namespace"]
        if not NAMESPACE.fullmatch(namespace) or len(namespace) > 63:
            raise CommandError(f"--namespace: {namespace!r} is not a namespace name: lower-case "
                               "letters, digits and '-', beginning and ending with a letter or "
                               "digit, at most 63 characters")
        if not IMAGE.fullmatch(options["image"]):
            raise CommandError(f"--image: {options['image']!r} is not an image reference")
        if options["gateway"] == (options["deployment"] is not None):
            raise CommandError("DEPLOYMENT: name one deployment, or give --gateway instead")
        target = k8s_objects.Target(namespace=namespace, image=options["image"],
                                      gpus_per_node=options["gpus_per_node"])
        if options["gateway"]:
            file_name, text = "gateway.yaml", k8s_gateway.render(target)
        else:
            deployment = Deployment.objects.filter(name=options["deployment"]).first()
            if deployment is None:
                known = ", ".join(Deployment.objects.values_list("name", flat=True)) or "none"
                raise CommandError(f"DEPLOYMENT: no deployment is named "
                                   f"{options['deployment']!r} (there are: {known})")
            try:
                text = k8s_manifests.render(deployment, target)
            except k8s_objects.ExportError as error:
                raise CommandError(str(error)) from error
            file_name = f"{deployment.name}.yaml"
        out: Path | None = options["out"]
        if out is None:
            self.stdout.write(text, ending="")
            return
        if out.exists() and not out.is_dir():
            raise CommandError(f"--out: {out} is not a directory")
        out.mkdir(parents=True, exist_ok=True)
        path = out / file_name
        path.write_text(text, encoding="utf-8")
        self.stdout.write(f"wrote {path}")
