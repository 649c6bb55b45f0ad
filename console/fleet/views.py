from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import ProtectedError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.roles import is_superuser
from console.fleet.forms import NodeForm
from console.fleet.models import Node
from console.fleet.services import delete_manual_node, discover_local_node, save_manual_node


def _require_superuser(request: HttpRequest) -> None:
    # Nodes are every team's: a superuser's to change.
    if not is_superuser(request.user):
        raise PermissionDenied("only a superuser may change nodes")


def _context(request: HttpRequest, form: NodeForm | None = None,
             error: str = "") -> dict[str, object]:
    # Read only: the supervise daemon rediscovers the local node; "Discover" does it now.
    return {"nodes": Node.objects.prefetch_related("gpus").select_related("agent"),
            "form": form or NodeForm(),
            "error": error, "can_change": is_superuser(request.user)}


@login_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    return render(request, "fleet/nodes.html", _context(request))


@login_required
@require_POST
def node_new(request: HttpRequest) -> HttpResponse:
    _require_superuser(request)
    form = NodeForm(request.POST)
    if not form.is_valid():
        return render(request, "fleet/nodes.html", _context(request, form), status=400)
    save_manual_node(None, form.node_fields())
    return redirect("fleet")


@login_required
@require_POST
def node_delete(request: HttpRequest, pk: int) -> HttpResponse:
    _require_superuser(request)
    node = get_object_or_404(Node, pk=pk, is_local=False)
    try:
        delete_manual_node(node)
    except ProtectedError:
        return render(request, "fleet/nodes.html", _context(
            request, error=f"node {node.name} has planned workers; move them to another node first"),
            status=409)
    return redirect("fleet")


@login_required
@require_POST
def discover(request: HttpRequest) -> HttpResponse:
    _require_superuser(request)
    discover_local_node()
    return redirect("fleet")
