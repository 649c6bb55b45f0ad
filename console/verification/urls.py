from django.urls import path

from console.verification import views

urlpatterns = [
    path("deployments/<slug:name>/verify/", views.verify, name="deployment-verify"),
    path("verifications/<int:pk>/", views.report_page, name="verification-page"),
    path("verifications/<int:pk>/panel/", views.report_panel, name="verification-panel"),
]
