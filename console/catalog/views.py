from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.roles import is_superuser
from console.catalog.forms import BaseModelForm, QuantizeForm, RegisterForm
from console.catalog.models import BaseModel, QuantizationJob, Variant
from console.catalog.services import (
    RegistrationError,
    create_base_model,
    register_variant,
    reinspect_variant,
)


def require_superuser(request: HttpRequest) -> None:
    """Models, variants and their builds are shared by every team: a superuser's to change."""
    if not is_superuser(request.user):
        raise PermissionDenied("only a superuser may change models")


def page_context(request: HttpRequest, **forms: object) -> dict[str, object]:
    models = list(BaseModel.objects.prefetch_related("variants"))
    failed_quantize = forms.get("quantize_form")
    for model in models:
        model.quantize_form = (failed_quantize if forms.get("quantize_base") == model.pk
                               else QuantizeForm(prefix=f"quantize-{model.pk}"))
    return {
        "models": models,
        "base_form": forms.get("base_form") or BaseModelForm(prefix="base"),
        "register_form": forms.get("register_form") or RegisterForm(prefix="variant"),
        **_jobs_context(request),
    }


def _jobs_context(request: HttpRequest) -> dict[str, object]:
    # Read only: the supervise daemon fails jobs orphaned by a killed worker.
    return {"jobs": QuantizationJob.objects.select_related("base", "source")[:20],
            # What the page offers: the forms and buttons only to whom may use them.
            "can_change": is_superuser(request.user)}


@login_required
@require_GET
def catalog(request: HttpRequest) -> HttpResponse:
    return render(request, "catalog/models.html", page_context(request))


@login_required
@require_GET
def variant_table(request: HttpRequest) -> HttpResponse:
    """The variants table alone: the page refreshes it while hashing runs."""
    return render(request, "catalog/_variants.html", page_context(request))


@login_required
@require_POST
def base_new(request: HttpRequest) -> HttpResponse:
    require_superuser(request)
    form = BaseModelForm(request.POST, prefix="base")
    if not form.is_valid():
        return render(request, "catalog/models.html", page_context(request, base_form=form),
                      status=400)
    create_base_model(form.cleaned_data["name"], form.cleaned_data["description"])
    return redirect("catalog")


@login_required
@require_POST
def variant_register(request: HttpRequest) -> HttpResponse:
    require_superuser(request)
    form = RegisterForm(request.POST, prefix="variant")
    if form.is_valid():
        try:
            register_variant(form.cleaned_data["base"], form.cleaned_data["name"],
                             form.cleaned_data["path"])
        except RegistrationError as exc:
            form.add_error(exc.field, str(exc))
        else:
            return redirect("catalog")
    return render(request, "catalog/models.html", page_context(request, register_form=form),
                  status=400)


@login_required
@require_POST
def variant_inspect(request: HttpRequest, pk: int) -> HttpResponse:
    require_superuser(request)
    reinspect_variant(get_object_or_404(Variant, pk=pk))
    return redirect("catalog")


@login_required
@require_GET
def job_table(request: HttpRequest) -> HttpResponse:
    """The quantization jobs alone: the page refreshes it every second."""
    return render(request, "catalog/_jobs.html", _jobs_context(request))
