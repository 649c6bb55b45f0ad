from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from console.api_router import api_path

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    api_path("api/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/", include("console.audit.api.urls")),
    path("api/v1/", include("console.accounts.api.urls")),
    path("api/v1/", include("console.credentials.api.urls")),
    path("api/v1/", include("console.control.api.urls")),
    path("api/v1/", include("console.catalog.api.urls")),
    path("api/v1/", include("console.quantization.api.urls")),
    path("api/v1/", include("console.fleet.api.urls")),
    path("api/v1/", include("console.supervisor.api.urls")),
    path("api/v1/", include("console.live.api.urls")),
    path("api/v1/", include("console.gateway.api.urls")),
    path("api/v1/", include("console.quality.api.urls")),
    path("api/v1/", include("console.playground.api.urls")),
    path("api/v1/", include("console.alerts.api.urls")),
    path("api/v1/", include("console.diagnosis.api.urls")),
    path("api/v1/", include("console.verification.api.urls")),
    path("api/v1/", include("console.rollouts.api.urls")),
    path("api/v1/", include("console.advisor.api.urls")),
    path("api/v1/", include("console.autoscaling.api.urls")),
    path("", include("console.audit.urls")),
    path("", include("console.accounts.urls")),
    path("", include("console.credentials.urls")),
    path("", include("console.live.urls")),
    path("", include("console.playground.urls")),
    path("", include("console.catalog.urls")),
    path("", include("console.quantization.urls")),
    path("", include("console.fleet.urls")),
    path("", include("console.gateway.urls")),
    path("", include("console.quality.urls")),
    path("", include("console.alerts.urls")),
    path("", include("console.diagnosis.urls")),
    path("", include("console.verification.urls")),
    path("", include("console.rollouts.urls")),
    path("", include("console.advisor.urls")),
    path("", include("console.autoscaling.urls")),
    path("", include("console.control.urls")),
]
