from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role
from console.accounts.roles import require, visible
from console.deployments.models import Deployment
from console.verification import services
from console.verification.forms import VerifyForm
from console.verification.models import VerificationReport


def _report(request: HttpRequest, pk: int) -> VerificationReport:
    """The report if the user's team owns its deployment, else 404."""
    return get_object_or_404(visible(VerificationReport.objects.select_related("deployment"),
                                     request.user, team_field="deployment__team"), pk=pk)


@login_required
@require_POST
def verify(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)
    require(request.user, deployment.team_id, Role.OPERATOR)
    form = VerifyForm(request.POST)
    if not form.is_valid():
        return render(request, "quality/refused.html", {
            "deployment": deployment, "action": "Verify", "reason": form.errors.as_text()},
            status=400)
    data = form.cleaned_data
    try:
        report = services.queue_verification(
            deployment, VerificationReport.Trigger.DEMAND,
            budget_s=data["budget_s"] or services.DEFAULT_BUDGET_S,
            run_options=services.options(stress_s=services.DEFAULT_STRESS_S
                                         if data["stress_s"] is None else data["stress_s"]),
            user=request.user)
    except services.VerificationRefused as exc:
        return render(request, "quality/refused.html", {
            "deployment": deployment, "action": "Verify", "reason": str(exc)}, status=409)
    return redirect("verification-page", pk=report.pk)


@login_required
@require_GET
def report_page(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "verification/report.html", {"report": _report(request, pk)})


@login_required
@require_GET
def report_panel(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "verification/_report.html", {"report": _report(request, pk)})
