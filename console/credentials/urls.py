from django.urls import path

from console.credentials import views

urlpatterns = [
    path("tokens/", views.tokens, name="api-tokens"),
    path("tokens/new/", views.token_new, name="api-token-new"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="api-token-revoke"),
]
