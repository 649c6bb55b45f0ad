from django.urls import path

from console.gateway import views

urlpatterns = [
    path("keys/", views.keys, name="keys"),
    path("keys/new/", views.key_new, name="key-new"),
    path("keys/<int:pk>/revoke/", views.key_revoke, name="key-revoke"),
    path("gateway/", views.gateway, name="gateway"),
    path("gateway/aliases/new/", views.alias_new, name="alias-new"),
    path("gateway/aliases/<int:pk>/delete/", views.alias_delete, name="alias-delete"),
    path("usage/", views.usage, name="usage"),
]
