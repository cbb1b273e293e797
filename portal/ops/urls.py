from django.urls import path

from portal.ops import views

urlpatterns = [
    path("", views.home, name="home"),
    path("utilization/", views.utilization, name="utilization"),
    path("fairness/", views.fairness, name="fairness"),
    path("idle/", views.idle, name="idle"),
    path("idle/drill/", views.idle_drill, name="idle-drill"),
    path("capacity/", views.capacity, name="capacity"),
    path("capacity/forecasts/refresh/", views.forecast_refresh, name="forecast-refresh"),
    path("capacity/exceed/", views.capacity_exceed, name="capacity-exceed"),
    path("capacity/whatif/", views.whatif_new, name="whatif-new"),
    path("capacity/whatif/<str:whatif_id>/", views.whatif, name="whatif"),
    path("quotas/", views.quotas, name="quotas"),
    path("quotas/new/", views.quota_new, name="quota-new"),
    path("quotas/<int:quota_id>/", views.quota_edit, name="quota-edit"),
    path("projects/<int:project_id>/weight/", views.project_weight, name="project-weight"),
    path("policy/", views.policy, name="policy"),
    path("audit/", views.audit, name="audit"),
]
