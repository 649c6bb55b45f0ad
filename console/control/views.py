from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts.models import Role, Team
from console.accounts.roles import may, require, role_in, visible, visible_teams
from console.checks.suite import Report
from console.control import lifecycle
from console.control.status import degraded_role, overall_state
from console.deployments.forms import PlanEditor
from console.deployments.models import Deployment
from console.deployments.placement import Ledger
from console.fleet.models import Node
from console.fleet.services import local_node
from console.live.start_phase import current_phases
from console.quality.views import advice_context, gate_context


def _deployments(request: HttpRequest) -> list[Deployment]:
    return list(visible(Deployment.objects.select_related("base_model", "team").prefetch_related(
        "workers__variant", "processes"
    ), request.user))


def _get(request: HttpRequest, name: str, role: Role = Role.VIEWER) -> Deployment:
    """The deployment if the user's team owns it (else 404) and their role there is at least
    ``role`` (else 403)."""
    deployment = get_object_or_404(visible(
        Deployment.objects.prefetch_related("processes", "workers__variant", "workers__node"),
        request.user), name=name)
    require(request.user, deployment.team_id, role)
    return deployment


def _context(request: HttpRequest, deployment: Deployment) -> dict[str, object]:
    processes = list(deployment.processes.all())
    phases = current_phases(processes)
    held = role_in(request.user, deployment.team_id)
    return {
        "deployment": deployment,
        "state": overall_state(deployment, processes),
        "degraded": degraded_role(processes),
        "processes": [(p, p.tail(5), phases.get(p.pk)) for p in processes],
        # What the page offers: buttons for what the role may do, nothing else.
        "can_operate": held is not None and held.rank >= Role.OPERATOR.rank,
        "can_edit": held is not None and held.rank >= Role.ADMIN.rank,
    }


def _page(request: HttpRequest, deployment: Deployment) -> dict[str, object]:
    """The detail page: the process table plus the output gate and advice panels."""
    return {**_context(request, deployment), **gate_context(deployment),
            **advice_context(deployment)}


def _admin_teams(request: HttpRequest) -> list[Team]:
    return [t for t in visible_teams(request.user) if may(request.user, t.pk, Role.ADMIN)]


@login_required
@require_GET
def deployment_list(request: HttpRequest) -> HttpResponse:
    rows = [(d, overall_state(d, list(d.processes.all()))) for d in _deployments(request)]
    return render(request, "deployments/list.html",
                  {"rows": rows, "can_create": bool(_admin_teams(request))})


@login_required
@require_GET
def deployment_detail(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _get(request, name)
    return render(request, "deployments/detail.html",
                  {**_page(request, deployment), "report": lifecycle.check(deployment)})


@login_required
@require_GET
def deployment_processes(request: HttpRequest, name: str) -> HttpResponse:
    """The process table alone, fetched every few seconds by the page's script."""
    return render(request, "deployments/_processes.html", _context(request, _get(request, name)))


@login_required
@require_GET
def deployment_checks(request: HttpRequest, name: str) -> HttpResponse:
    """The check table alone: the detail page refreshes it (ports change while it is open)."""
    return render(request, "deployments/_checks.html",
                  {"report": lifecycle.check(_get(request, name))})


@login_required
@require_POST
def deployment_start(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _get(request, name, Role.OPERATOR)
    try:
        lifecycle.start(deployment)
    except lifecycle.Refused as exc:
        context = {**_page(request, deployment), "report": exc.report, "refused": str(exc)}
        return render(request, "deployments/detail.html", context, status=409)
    return redirect("deployment-detail", name=name)


@login_required
@require_POST
def deployment_stop(request: HttpRequest, name: str) -> HttpResponse:
    lifecycle.stop(_get(request, name, Role.OPERATOR))
    return redirect("deployment-detail", name=name)


@login_required
@require_http_methods(["GET", "POST"])
def plan_new(request: HttpRequest) -> HttpResponse:
    if not _admin_teams(request):
        raise PermissionDenied("creating a deployment needs the admin role in a team")
    return _plan_page(request, None)


@login_required
@require_http_methods(["GET", "POST"])
def plan_edit(request: HttpRequest, name: str) -> HttpResponse:
    return _plan_page(request, _get(request, name, Role.ADMIN))


def _plan_page(request: HttpRequest, deployment: Deployment | None) -> HttpResponse:
    teams = Team.objects.filter(pk__in=[t.pk for t in _admin_teams(request)])
    editor = PlanEditor(request.POST if request.method == "POST" else None, deployment, teams)
    context: dict[str, object] = {"editor": editor, "deployment": deployment}
    if request.method != "POST":
        context["report"] = lifecycle.check(deployment) if deployment else None
        return render(request, "deployments/plan_form.html", context)
    if not editor.is_valid():
        return render(request, "deployments/plan_form.html", context, status=400)
    try:
        saved, _ = lifecycle.save(editor.plan_input(), deployment, user=request.user)
    except lifecycle.DraftMade as exc:
        messages.info(request, _drafted(exc))
        return redirect("revisions", name=exc.revision.deployment.name)
    except ValidationError as exc:
        editor.add_errors(exc)
        return render(request, "deployments/plan_form.html", context, status=400)
    except lifecycle.Refused as exc:
        context.update(report=exc.report, refused=str(exc))
        return render(request, "deployments/plan_form.html", context, status=409)
    return redirect("deployment-detail", name=saved.name)


def _drafted(exc: lifecycle.DraftMade) -> str:
    """The message of a running deployment's edit that became a draft revision."""
    changes = "; ".join(f"{field}: {before!r} -> {after!r}"
                        for field, (before, after) in exc.changes.items())
    failed = "; ".join(outcome.message for outcome in exc.report.errors)
    applied = (" Its live edits (instances, devices, ports, router settings) are applied."
               if exc.live_edits else "")
    return (f"{exc.revision.deployment.name} is running: the edit is draft revision r{exc.revision.number} "
            f"({changes}), not applied to the running workers; roll it out from this page."
            f"{applied} The draft's checks {'pass' if exc.report.ok else 'fail: ' + failed}.")


@login_required
@require_POST
def plan_check(request: HttpRequest, name: str | None = None) -> HttpResponse:
    """The check table of the form's current content, unsaved: the form's live panel."""
    deployment = _get(request, name, Role.ADMIN) if name else None
    teams = _admin_teams(request)
    if deployment is None and not teams:
        raise PermissionDenied("creating a deployment needs the admin role in a team")
    editor = PlanEditor(request.POST, deployment, Team.objects.filter(pk__in=[t.pk for t in teams]))
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
    deployment = _get(request, name, Role.ADMIN) if name else None
    if deployment is None and not _admin_teams(request):
        raise PermissionDenied("creating a deployment needs the admin role in a team")
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
