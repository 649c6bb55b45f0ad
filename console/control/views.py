from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.checks.suite import Report
from console.control import lifecycle
from console.control.status import overall_state
from console.deployments.forms import PlanEditor
from console.deployments.models import Deployment
from console.deployments.placement import Ledger
from console.fleet.models import Node
from console.fleet.services import local_node
from console.quality.views import advice_context, gate_context


def _deployments() -> list[Deployment]:
    return list(Deployment.objects.select_related("base_model").prefetch_related(
        "workers__variant", "processes"
    ))


def _get(name: str) -> Deployment:
    return get_object_or_404(
        Deployment.objects.prefetch_related("processes", "workers__variant", "workers__node"),
        name=name,
    )


def _context(deployment: Deployment) -> dict[str, object]:
    processes = list(deployment.processes.all())
    return {
        "deployment": deployment,
        "state": overall_state(deployment, processes),
        "processes": [(p, p.tail(5)) for p in processes],
    }


def _page(deployment: Deployment) -> dict[str, object]:
    """The detail page: the process table plus the output gate and advice panels."""
    return {**_context(deployment), **gate_context(deployment), **advice_context(deployment)}


@login_required
def deployment_list(request: HttpRequest) -> HttpResponse:
    rows = [(d, overall_state(d, list(d.processes.all()))) for d in _deployments()]
    return render(request, "deployments/list.html", {"rows": rows})


@login_required
def deployment_detail(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _get(name)
    return render(request, "deployments/detail.html",
                  {**_page(deployment), "report": lifecycle.check(deployment)})


@login_required
def deployment_processes(request: HttpRequest, name: str) -> HttpResponse:
    """The process table alone, fetched every few seconds by the page's script."""
    return render(request, "deployments/_processes.html", _context(_get(name)))


@login_required
def deployment_checks(request: HttpRequest, name: str) -> HttpResponse:
    """The check table alone: the detail page refreshes it (ports change while it is open)."""
    return render(request, "deployments/_checks.html", {"report": lifecycle.check(_get(name))})


@login_required
@require_POST
def deployment_start(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _get(name)
    try:
        lifecycle.start(deployment)
    except lifecycle.Refused as exc:
        context = {**_page(deployment), "report": exc.report, "refused": str(exc)}
        return render(request, "deployments/detail.html", context, status=409)
    return redirect("deployment-detail", name=name)


@login_required
@require_POST
def deployment_stop(request: HttpRequest, name: str) -> HttpResponse:
    lifecycle.stop(get_object_or_404(Deployment, name=name))
    return redirect("deployment-detail", name=name)


@login_required
def plan_new(request: HttpRequest) -> HttpResponse:
    return _plan_page(request, None)


@login_required
def plan_edit(request: HttpRequest, name: str) -> HttpResponse:
    return _plan_page(request, _get(name))


def _plan_page(request: HttpRequest, deployment: Deployment | None) -> HttpResponse:
    editor = PlanEditor(request.POST if request.method == "POST" else None, deployment)
    context: dict[str, object] = {"editor": editor, "deployment": deployment}
    if request.method != "POST":
        context["report"] = lifecycle.check(deployment) if deployment else None
        return render(request, "deployments/plan_form.html", context)
    if not editor.is_valid():
        return render(request, "deployments/plan_form.html", context, status=400)
    try:
        saved, _ = lifecycle.save(editor.plan_input(), deployment)
    except ValidationError as exc:
        editor.add_errors(exc)
        return render(request, "deployments/plan_form.html", context, status=400)
    except lifecycle.Refused as exc:
        context.update(report=exc.report, refused=str(exc))
        return render(request, "deployments/plan_form.html", context, status=409)
    return redirect("deployment-detail", name=saved.name)


@login_required
@require_POST
def plan_check(request: HttpRequest, name: str | None = None) -> HttpResponse:
    """The check table of the form's current content, unsaved: the form's live panel."""
    deployment = _get(name) if name else None
    editor = PlanEditor(request.POST, deployment)
    report: Report | None = None
    if editor.is_valid():
        try:
            report = lifecycle.preview(editor.plan_input(), deployment)
        except ValidationError as exc:
            editor.add_errors(exc)
    return render(request, "deployments/_checks.html",
                  {"report": report, "form_errors": editor.error_list()})


@login_required
@require_POST
def plan_propose(request: HttpRequest, name: str | None = None) -> JsonResponse:
    """Values for a new instance row: a free port, side-channel port and device on its node.

    Reads the form's rows as they stand, so the proposal avoids values not saved yet.
    """
    deployment = _get(name) if name else None
    node = Node.objects.filter(pk=request.POST.get("node") or 0).first() or local_node()
    ledger = Ledger.for_node(node, exclude=deployment)
    for key, value in request.POST.items():
        if key.endswith(("-port", "-side_channel_port", "router_port")) and value.isdigit():
            ledger.ports.add(int(value))
        elif key.endswith("-cpu_cores") and value:
            for core in value.split(","):
                if core.strip().isdigit():
                    ledger.cores[int(core)] = ledger.cores.get(int(core), 0) + 1
        elif key.endswith("-gpu_indices") and value:
            ledger.gpus |= {int(g) for g in value.split(",") if g.strip().isdigit()}
    role = request.POST.get("role", "decode")
    gpu = ledger.gpu()
    return JsonResponse({
        "node": node.pk, "port": ledger.port(role), "side_channel_port": ledger.side_channel_port(),
        "gpu_indices": gpu, "cpu_cores": "" if gpu else ledger.core(),
    })
