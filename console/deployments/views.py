from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.deployments.models import Deployment
from console.deployments.services import request_state
from console.deployments.status import overall_state


def _deployments() -> list[Deployment]:
    return list(Deployment.objects.select_related("base_model").prefetch_related(
        "workers__variant", "processes"
    ))


def _context(deployment: Deployment) -> dict[str, object]:
    processes = list(deployment.processes.all())
    return {
        "deployment": deployment,
        "state": overall_state(deployment, processes),
        "processes": [(p, p.tail(5)) for p in processes],
    }


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    rows = [(d, overall_state(d, list(d.processes.all()))) for d in _deployments()]
    return render(request, "deployments/list.html", {"rows": rows})


@login_required
def deployment_detail(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment.objects.prefetch_related("processes"), name=name)
    return render(request, "deployments/detail.html", _context(deployment))


@login_required
def deployment_processes(request: HttpRequest, name: str) -> HttpResponse:
    """The process table alone, fetched every few seconds by the page's script."""
    deployment = get_object_or_404(Deployment.objects.prefetch_related("processes"), name=name)
    return render(request, "deployments/_processes.html", _context(deployment))


@login_required
@require_POST
def deployment_start(request: HttpRequest, name: str) -> HttpResponse:
    request_state(get_object_or_404(Deployment, name=name), Deployment.DesiredState.RUNNING)
    return redirect("deployment-detail", name=name)


@login_required
@require_POST
def deployment_stop(request: HttpRequest, name: str) -> HttpResponse:
    request_state(get_object_or_404(Deployment, name=name), Deployment.DesiredState.STOPPED)
    return redirect("deployment-detail", name=name)
