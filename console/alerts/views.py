from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts.models import Role
from console.accounts.roles import may, require, visible, visible_teams
from console.alerts import services
from console.alerts.api.serializers import AlertRuleSerializer, NotifierSerializer
from console.alerts.forms import (
    RULE_FIELDS,
    AcknowledgeForm,
    AlertRuleForm,
    HistoryFilterForm,
    NotifierForm,
    SilenceFromAlertForm,
)
from console.alerts.matchers import matches
from console.alerts.models import (
    Alert,
    AlertEvent,
    AlertRule,
    AlertState,
    Delivery,
    Notifier,
    Silence,
)
from console.alerts.notifiers.targets import masked_url
from console.alerts.rule_preview import preview
from console.alerts.symptom_links import doctor_path_of
from console.deployments.models import Deployment

SPARKLINE_S = 900.0


def _alerts(request: HttpRequest) -> Any:
    return visible(Alert.objects.select_related("deployment", "rule", "acknowledged_by"),
                   request.user, "deployment__team")


def _operates(request: HttpRequest, team_id: int) -> bool:
    return may(request.user, team_id, Role.OPERATOR)


def _silences_now() -> list[Silence]:
    now = timezone.now()
    return list(Silence.objects.filter(starts_at__lte=now, ends_at__gt=now,
                                       expired_early_at__isnull=True))


def _silenced_by(alert: Alert, silences: list[Silence]) -> Silence | None:
    """The active silence of the alert's team that matches it, as the evaluator judges it."""
    return next((silence for silence in silences if silence.team_id == alert.deployment.team_id
                 and matches(silence.matchers, alert.labels)), None)


@login_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    """Firing, pending and NoData alerts of the reader's teams; alerts.js keeps it live."""
    alerts = _alerts(request).exclude(state=AlertState.INACTIVE).order_by("state", "-fired_at")
    if request.GET.get("deployment"):
        alerts = alerts.filter(deployment__name=request.GET["deployment"])
    silences = _silences_now()
    rows = [{"alert": alert, "can_operate": _operates(request, alert.deployment.team_id),
             "silence": _silenced_by(alert, silences)} for alert in alerts]
    return render(request, "alerts/dashboard.html", {
        "rows": rows, "deployment": request.GET.get("deployment", ""),
        "silence_form": SilenceFromAlertForm(), "ack_form": AcknowledgeForm()})


@login_required
@require_GET
def alert_detail(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(_alerts(request), pk=pk)
    return render(request, "alerts/detail.html", {
        "alert": alert, "events": alert.events.all()[:100],
        "doctor_url": doctor_path_of(alert.labels),
        "can_operate": _operates(request, alert.deployment.team_id),
        "silence_form": SilenceFromAlertForm(), "ack_form": AcknowledgeForm()})


@login_required
@require_GET
def alert_row(request: HttpRequest, pk: int) -> HttpResponse:
    """One dashboard row, rendered for its reader (their buttons): alerts.js inserts it when a
    message says the alert changed."""
    alert = get_object_or_404(_alerts(request), pk=pk)
    return render(request, "alerts/_row.html", {"row": {
        "alert": alert, "can_operate": _operates(request, alert.deployment.team_id),
        "silence": _silenced_by(alert, _silences_now())}})


@login_required
@require_GET
def alert_series(request: HttpRequest, pk: int) -> JsonResponse:
    """The alert's series over the last 15 minutes with its threshold, for its sparkline."""
    alert = get_object_or_404(_alerts(request), pk=pk)
    answer = preview(alert.rule, timezone.now(), span_s=SPARKLINE_S)
    role, process = alert.labels.get("role", ""), alert.labels.get("process", "")
    points = next((i["points"] for i in answer["instances"]
                   if i["role"] == role and i["process"] == process), [])
    return JsonResponse({"threshold": answer["threshold"], "unit": answer["unit"],
                         "points": points})


@login_required
@require_POST
def alert_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    alert = get_object_or_404(_alerts(request), pk=pk)
    require(request.user, alert.deployment.team_id, Role.OPERATOR)
    form = AcknowledgeForm(request.POST)
    if not form.is_valid():
        return HttpResponse(form.errors.as_text(), status=400)
    services.acknowledge(alert, request.user, form.cleaned_data["comment"])
    return redirect(request.POST.get("next") or "alerts")


@login_required
@require_POST
def alert_silence(request: HttpRequest, pk: int) -> HttpResponse:
    """Silence this alert's label set (alert name, deployment, process) for a while."""
    alert = get_object_or_404(_alerts(request), pk=pk)
    require(request.user, alert.deployment.team_id, Role.OPERATOR)
    form = SilenceFromAlertForm(request.POST)
    if not form.is_valid():
        return HttpResponse(form.errors.as_text(), status=400)
    now = timezone.now()
    matchers = [{"name": name, "op": "=", "value": alert.labels[name]}
                for name in ("alertname", "deployment", "process") if alert.labels.get(name)]
    services.create_silence({
        "team": alert.deployment.team, "matchers": matchers, "starts_at": now,
        "ends_at": now + timedelta(minutes=form.cleaned_data["minutes"]),
        "comment": form.cleaned_data["comment"]}, request.user)
    return redirect(request.POST.get("next") or "alerts")


@login_required
@require_GET
def history(request: HttpRequest) -> HttpResponse:
    form = HistoryFilterForm(request.GET or None)
    events = visible(AlertEvent.objects.select_related("alert__rule", "deployment"),
                     request.user, "deployment__team")
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        if data["deployment"]:
            events = events.filter(deployment__name=data["deployment"])
        if data["severity"]:
            events = events.filter(alert__rule__severity=data["severity"])
        if data["state"]:
            events = events.filter(to_state=data["state"])
        if data["rule"]:
            events = events.filter(alert__rule_id=data["rule"])
        if data["since"]:
            events = events.filter(at__gte=data["since"])
        if data["until"]:
            events = events.filter(at__lte=data["until"])
    page = Paginator(events, 50).get_page(request.GET.get("page"))
    return render(request, "alerts/history.html", {"form": form, "page": page})


@login_required
@require_GET
def silences(request: HttpRequest) -> HttpResponse:
    rows = visible(Silence.objects.select_related("team", "created_by"), request.user)
    now = timezone.now()
    return render(request, "alerts/silences.html", {"rows": [
        (silence, "expired" if silence.expired_early_at or silence.ends_at <= now
         else "active" if silence.starts_at <= now else "pending",
         _operates(request, silence.team_id)) for silence in rows[:200]]})


@login_required
@require_POST
def silence_expire(request: HttpRequest, pk: int) -> HttpResponse:
    silence = get_object_or_404(visible(Silence.objects.all(), request.user), pk=pk)
    require(request.user, silence.team_id, Role.OPERATOR)
    services.expire_silence(silence)
    return redirect("alert-silences")


# ---- rules -------------------------------------------------------------------------------------
def _admin_deployments(request: HttpRequest) -> Any:
    teams = [t.pk for t in visible_teams(request.user) if may(request.user, t.pk, Role.ADMIN)]
    return Deployment.objects.filter(team__in=teams)


def _validated(request: HttpRequest, form: AlertRuleForm, rule: AlertRule | None
               ) -> dict[str, Any] | None:
    """The posted rule judged by the API's serializer; its errors land on the form's fields."""
    if not form.is_valid():
        return None
    data = {name: form.cleaned_data[name] for name in RULE_FIELDS}
    data["deployment"] = data["deployment"].name
    data["labels"] = data["labels"] or {}
    data["inhibits"] = data["inhibits"] or []
    serializer = AlertRuleSerializer(rule, data=data, context={"request": request})
    if serializer.is_valid():
        return dict(serializer.validated_data)
    for field, errors in serializer.errors.items():
        form.add_error(field if field in form.fields else None, [str(e) for e in errors])
    return None


@login_required
@require_GET
def rules(request: HttpRequest) -> HttpResponse:
    rows = visible(AlertRule.objects.select_related("deployment").prefetch_related("alerts"),
                   request.user, "deployment__team")
    if request.GET.get("deployment"):
        rows = rows.filter(deployment__name=request.GET["deployment"])
    return render(request, "alerts/rules.html", {"rows": [
        (rule, sum(1 for a in rule.alerts.all() if a.state == AlertState.FIRING),
         may(request.user, rule.deployment.team_id, Role.ADMIN)) for rule in rows],
        "can_create": _admin_deployments(request).exists()})


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    rule = None
    if pk is not None:
        rule = get_object_or_404(visible(AlertRule.objects.select_related("deployment"),
                                         request.user, "deployment__team"), pk=pk)
        require(request.user, rule.deployment.team_id, Role.ADMIN)
    elif not _admin_deployments(request).exists():
        raise PermissionDenied("a new rule needs the admin role in a deployment's team")
    form = AlertRuleForm(request.POST or None, instance=rule)
    form.fields["deployment"].queryset = _admin_deployments(request)
    if request.method == "POST":
        data = _validated(request, form, rule)
        if data is not None:
            if rule is None:
                require(request.user, data["deployment"].team_id, Role.ADMIN)
                services.create_rule(data)
            else:
                services.update_rule(rule, data)
            return redirect("alert-rules")
    return render(request, "alerts/rule_form.html", {"form": form, "rule": rule},
                  status=400 if form.errors else 200)


@login_required
@require_POST
def rule_preview(request: HttpRequest) -> JsonResponse:
    """The rule form's "evaluate over the last hour", before it is saved; nothing is stored."""
    if not _admin_deployments(request).exists():
        raise PermissionDenied("previewing a rule needs the admin role in a deployment's team")
    form = AlertRuleForm(request.POST)
    form.fields["deployment"].queryset = _admin_deployments(request)
    data = _validated(request, form, None)
    if data is None:
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)
    return JsonResponse(preview(AlertRule(**data), timezone.now()))


@login_required
@require_POST
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    rule = get_object_or_404(visible(AlertRule.objects.select_related("deployment"),
                                     request.user, "deployment__team"), pk=pk)
    require(request.user, rule.deployment.team_id, Role.ADMIN)
    services.delete_rule(rule)
    return redirect("alert-rules")


# ---- notifiers ---------------------------------------------------------------------------------
def _notifiers_page(request: HttpRequest, form: NotifierForm | None = None,
                    status: int = 200) -> HttpResponse:
    admin_teams = [t for t in visible_teams(request.user) if may(request.user, t.pk, Role.ADMIN)]
    form = form or NotifierForm()
    form.fields["team"].queryset = visible_teams(request.user).filter(
        pk__in=[t.pk for t in admin_teams])
    notifiers = visible(Notifier.objects.select_related("team"), request.user)
    deliveries = visible(Delivery.objects.select_related(
        "notifier", "deployment").prefetch_related("attempt_log"), request.user,
        "notifier__team")[:50]
    return render(request, "alerts/notifiers.html", {
        # A webhook's URL in full only to whoever may edit it (targets.masked_url).
        "notifiers": [(n, editable, n.url if editable else masked_url(n.url))
                      for n in notifiers
                      for editable in [may(request.user, n.team_id, Role.ADMIN)]],
        "deliveries": deliveries, "form": form, "can_create": bool(admin_teams)},
        status=status)


@login_required
@require_GET
def notifiers(request: HttpRequest) -> HttpResponse:
    return _notifiers_page(request)


@login_required
@require_POST
def notifier_new(request: HttpRequest) -> HttpResponse:
    if not any(may(request.user, t.pk, Role.ADMIN) for t in visible_teams(request.user)):
        raise PermissionDenied("a notifier needs the admin role in a team")
    form = NotifierForm(request.POST)
    if not form.is_valid():
        return _notifiers_page(request, form, status=400)
    team = form.cleaned_data["team"]
    require(request.user, team.pk, Role.ADMIN)
    data = {name: value for name, value in form.cleaned_data.items()}
    data["recipients"] = data["recipients"] or []
    serializer = NotifierSerializer(data={**data, "team": team.name},
                                    context={"request": request})
    if not serializer.is_valid():
        for field, errors in serializer.errors.items():
            form.add_error(field if field in form.fields else None, [str(e) for e in errors])
        return _notifiers_page(request, form, status=400)
    services.create_notifier({**serializer.validated_data, "team": team})
    return redirect("alert-notifiers")


@login_required
@require_POST
def notifier_delete(request: HttpRequest, pk: int) -> HttpResponse:
    notifier = get_object_or_404(visible(Notifier.objects.all(), request.user), pk=pk)
    require(request.user, notifier.team_id, Role.ADMIN)
    services.delete_notifier(notifier)
    return redirect("alert-notifiers")
