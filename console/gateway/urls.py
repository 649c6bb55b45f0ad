from django.urls import path

from console.gateway import views

urlpatterns = [
    path("keys/", views.keys, name="keys"),
    path("keys/new/", views.key_new, name="key-new"),
    path("keys/<int:pk>/revoke/", views.key_revoke, name="key-revoke"),
]
