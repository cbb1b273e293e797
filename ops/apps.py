from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The staff pages: the top of the house, above `scheduling` and `forecasting` (no models)."""

    name = "ops"
    verbose_name = "Operations pages"
