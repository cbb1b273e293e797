from django.apps import AppConfig


def _round_trigger(cluster_id: int) -> None:
    # The composition root wires the task queue into the services (`scheduling.ports`); the
    # tasks module is read at call time, so a test that swaps its trigger swaps this one.
    from scheduling import tasks

    tasks.engine_round_trigger(cluster_id)


class SchedulingConfig(AppConfig):
    name = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Berth's gauges are read from the database at scrape time, so every web process that
        # serves /metrics needs the collector (rounds run in worker processes).
        from scheduling.metrics import register_collectors
        from scheduling.ports import set_round_trigger

        register_collectors()
        set_round_trigger(_round_trigger)
