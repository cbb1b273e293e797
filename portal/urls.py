from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/notifications/", include("notifications.api.urls")),
    path("api/v1/", include("scheduling.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its init script from a URL (no inline script: CSP script-src 'self').
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("", include("django_prometheus.urls")),
    path("", include("portal.accounts.urls")),
    path("ops/", include(("ops.urls", "ops"), namespace="ops")),
    path("", include("notifications.urls")),
    path("", include("scheduling.urls")),
]
