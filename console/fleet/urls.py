from django.urls import path

from console.fleet import views

urlpatterns = [
    path("nodes/", views.fleet, name="fleet"),
    path("nodes/new/", views.node_new, name="fleet-node-new"),
    path("nodes/discover/", views.discover, name="fleet-discover"),
    path("nodes/<int:pk>/delete/", views.node_delete, name="fleet-node-delete"),
]
