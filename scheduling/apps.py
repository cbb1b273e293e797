from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Berth's gauges are read from the database at scrape time, so every web process that
        # serves /metrics needs the collector (rounds run in worker processes).
        from scheduling.metrics import register_collectors

        register_collectors()
