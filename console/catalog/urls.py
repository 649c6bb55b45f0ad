from django.urls import path

from console.catalog import views

urlpatterns = [
    path("models/", views.catalog, name="catalog"),
    path("models/variants/", views.variant_table, name="catalog-variants"),
    path("models/new/", views.base_new, name="catalog-base-new"),
    path("models/register/", views.variant_register, name="catalog-register"),
    path("models/variants/<int:pk>/inspect/", views.variant_inspect, name="catalog-inspect"),
    path("models/jobs/", views.job_table, name="catalog-jobs"),
]
