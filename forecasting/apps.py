from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "forecasting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Scheduling asks for predictions only through its port (scheduling.ports), never by
        # importing this app: register the implementation once every app is loaded.
        from forecasting.port import ForecastingPredictionPort
        from forecasting.queue import set_task_queue
        from forecasting.tasks import CeleryTaskQueue
        from scheduling.ports import set_prediction_port

        set_prediction_port(ForecastingPredictionPort())
        # The services queue work through forecasting.queue, never by importing the tasks.
        set_task_queue(CeleryTaskQueue())
