from django.urls import path

from console.audit import views

urlpatterns = [
    path("audit/", views.audit_log, name="audit"),
]
