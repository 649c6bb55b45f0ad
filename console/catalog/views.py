from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.catalog.forms import BaseModelForm, RegisterForm
from console.catalog.models import BaseModel, Variant
from console.catalog.services import RegistrationError, register_variant, reinspect


def _context(**forms: object) -> dict[str, object]:
    return {
        "models": BaseModel.objects.prefetch_related("variants"),
        "base_form": forms.get("base_form") or BaseModelForm(prefix="base"),
        "register_form": forms.get("register_form") or RegisterForm(prefix="variant"),
    }


@login_required
def catalog(request: HttpRequest) -> HttpResponse:
    return render(request, "catalog/models.html", _context())


@login_required
def variant_table(request: HttpRequest) -> HttpResponse:
    """The variants table alone: the page refreshes it while hashing runs."""
    return render(request, "catalog/_variants.html", _context())


@login_required
@require_POST
def base_new(request: HttpRequest) -> HttpResponse:
    form = BaseModelForm(request.POST, prefix="base")
    if not form.is_valid():
        return render(request, "catalog/models.html", _context(base_form=form), status=400)
    form.save()
    return redirect("catalog")


@login_required
@require_POST
def variant_register(request: HttpRequest) -> HttpResponse:
    form = RegisterForm(request.POST, prefix="variant")
    if form.is_valid():
        try:
            register_variant(form.cleaned_data["base"], form.cleaned_data["name"],
                             form.cleaned_data["path"])
        except RegistrationError as exc:
            form.add_error(exc.field, str(exc))
        else:
            return redirect("catalog")
    return render(request, "catalog/models.html", _context(register_form=form), status=400)


@login_required
@require_POST
def variant_inspect(request: HttpRequest, pk: int) -> HttpResponse:
    reinspect(get_object_or_404(Variant, pk=pk))
    return redirect("catalog")
