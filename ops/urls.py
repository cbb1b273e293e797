from django.urls import path

from ops import views, views_capacity

urlpatterns = [
    path("", views.home, name="home"),
    path("utilization/", views.utilization, name="utilization"),
    path("fairness/", views.fairness, name="fairness"),
    path("idle/", views.idle, name="idle"),
    path("idle/drill/", views.idle_drill, name="idle-drill"),
    path("capacity/", views_capacity.capacity, name="capacity"),
    path("capacity/forecasts/refresh/", views_capacity.forecast_refresh, name="forecast-refresh"),
    path("capacity/exceed/", views_capacity.capacity_exceed, name="capacity-exceed"),
    path("capacity/whatif/", views_capacity.whatif_new, name="whatif-new"),
    path("capacity/whatif/<str:whatif_id>/", views_capacity.whatif, name="whatif"),
    path("quotas/", views.quotas, name="quotas"),
    path("quotas/new/", views.quota_new, name="quota-new"),
    path("quotas/<int:quota_id>/", views.quota_edit, name="quota-edit"),
    path("projects/<int:project_id>/weight/", views.project_weight, name="project-weight"),
    path("policy/", views.policy, name="policy"),
    path("audit/", views.audit, name="audit"),
]
