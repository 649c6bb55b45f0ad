from django.urls import path

from console.alerts import views

urlpatterns = [
    path("alerts/", views.dashboard, name="alerts"),
    path("alerts/history/", views.history, name="alert-history"),
    path("alerts/silences/", views.silences, name="alert-silences"),
    path("alerts/silences/<int:pk>/expire/", views.silence_expire, name="alert-silence-expire"),
    path("alerts/rules/", views.rules, name="alert-rules"),
    path("alerts/rules/new/", views.rule_edit, name="alert-rule-new"),
    path("alerts/rules/preview/", views.rule_preview, name="alert-rule-preview"),
    path("alerts/rules/<int:pk>/", views.rule_edit, name="alert-rule-edit"),
    path("alerts/rules/<int:pk>/delete/", views.rule_delete, name="alert-rule-delete"),
    path("alerts/notifiers/", views.notifiers, name="alert-notifiers"),
    path("alerts/notifiers/new/", views.notifier_new, name="alert-notifier-new"),
    path("alerts/notifiers/<int:pk>/delete/", views.notifier_delete,
         name="alert-notifier-delete"),
    path("alerts/<int:pk>/", views.alert_detail, name="alert-detail"),
    path("alerts/<int:pk>/row/", views.alert_row, name="alert-row"),
    path("alerts/<int:pk>/series/", views.alert_series, name="alert-series"),
    path("alerts/<int:pk>/acknowledge/", views.alert_acknowledge, name="alert-acknowledge"),
    path("alerts/<int:pk>/silence/", views.alert_silence, name="alert-silence"),
]
