from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models import ProtectedError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.fleet.forms import NodeForm
from console.fleet.models import Node
from console.fleet.services import refresh_local_node, save_manual_node


def _context(form: NodeForm | None = None, error: str = "") -> dict[str, object]:
    # Read only: the supervise daemon rediscovers the local node; "Discover" does it now.
    return {"nodes": Node.objects.prefetch_related("gpus"), "form": form or NodeForm(),
            "error": error}


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/nodes.html", _context())


@login_required
@require_POST
def node_new(request: HttpRequest) -> HttpResponse:
    form = NodeForm(request.POST)
    if not form.is_valid():
        return render(request, "fleet/nodes.html", _context(form), status=400)
    save_manual_node(None, form.node_fields())
    return redirect("fleet")


@login_required
@require_POST
def node_delete(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(Node, pk=pk, is_local=False)
    try:
        node.delete()
    except ProtectedError:
        return render(request, "fleet/nodes.html", _context(
            error=f"node {node.name} has planned workers; move them to another node first"),
            status=409)
    return redirect("fleet")


@login_required
@require_POST
def discover(request: HttpRequest) -> HttpResponse:
    refresh_local_node(max_age=timedelta(0))
    return redirect("fleet")
