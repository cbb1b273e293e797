"""Stored demand forecasts, capacity studies and capacity-exceed runs.

* `ForecastRun`: one fit of one model on one hourly demand series, issued at the start of
  an hour (the first forecast hour).  A series is a cluster plus one of: a GPU type (all
  demand on that type, or ``key=""`` for the whole cluster), a project, or the interactive
  demand (bookings + interactive jobs) on a GPU type.  At most one run per series, model and
  hour (a unique constraint): refreshing twice in one hour does not duplicate.
* `ForecastPoint`: the run's hourly point forecast, 80% interval and 95% upper bound,
  bulk-written, with the 24 h seasonal-naive forecast issued at the same time; once the
  hour is over, the hourly task records the actual demand on it (the track record the
  capacity page scores: rolling MASE against seasonal naive and band coverage).
* `CapacityStudy`: a what-if (the staff capacity page's): the lab's jobs of one GPU type
  replayed as the cluster is and with GPUs added or removed, run by a Celery task that stores
  its progress so the page can poll it.
* `CapacityExceedRun`: "when does demand exceed capacity" (the same page's): one forecast fit
  per GPU type of a cluster, run by a Celery task, its progress and crossings stored on the row.

Nothing happens in ``save()``: every write goes through ``forecasting.services``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q


class ForecastRun(models.Model):
    class Kind(models.TextChoices):
        GPU_TYPE = "gpu_type", "GPU type"  # key: GPU type name; "" is the cluster total
        PROJECT = "project", "Project"  # key: project slug
        INTERACTIVE = "interactive", "Interactive"  # key: GPU type name

    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.CASCADE, related_name="forecast_runs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    key = models.CharField(max_length=120, blank=True, default="")
    # Set when the key names one (for joins and admin filters); the key is what is unique.
    gpu_type = models.ForeignKey(
        "scheduling.GpuType", on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    project = models.ForeignKey(
        "accounts.Project", on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    model_name = models.CharField(max_length=40)
    model_version = models.CharField(max_length=40, blank=True, default="")
    issued_at = models.DateTimeField()  # first forecast hour (= end of the training window)
    train_start_at = models.DateTimeField()
    train_end_at = models.DateTimeField()  # exclusive: the training data covers [start, end)
    horizon_h = models.PositiveSmallIntegerField()
    history_hours = models.PositiveIntegerField(default=0)
    fit_s = models.FloatField(default=0.0)
    # Rolling-origin backtest of this series when one was run: {model: {mase, smape, coverage_80, ...}}.
    metrics = models.JSONField(null=True, blank=True)
    # "" for a modelled forecast; "no_signal" when the series had too few non-zero hours to
    # model and the forecast is the empirical distribution of its last week (the capacity
    # page says so).
    flag = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-issued_at", "cluster_id", "kind", "key"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "kind", "key", "model_name", "issued_at"], name="forecastrun_unique_hour"
            ),
            models.CheckConstraint(
                condition=Q(train_end_at__gt=F("train_start_at")), name="forecastrun_window"
            ),
            models.CheckConstraint(condition=Q(horizon_h__gte=1), name="forecastrun_horizon_positive"),
        ]
        indexes = [
            models.Index(fields=["cluster", "kind", "key", "-issued_at"], name="forecastrun_series_latest"),
        ]

    def __str__(self) -> str:
        key = self.key or "total"
        return f"{self.model_name} {self.kind}:{key} on {self.cluster_id} at {self.issued_at:%Y-%m-%d %H:%M}"


class ForecastPoint(models.Model):
    """One forecast hour: GPUs of demand (hourly mean), the 80% interval around it, and later
    what happened."""

    run = models.ForeignKey(ForecastRun, on_delete=models.CASCADE, related_name="points")
    ts = models.DateTimeField()  # start of the hour
    yhat = models.FloatField()
    lower80 = models.FloatField()
    upper80 = models.FloatField()
    upper95 = models.FloatField(null=True, blank=True)  # one-sided 95% bound; None: older runs
    # The 24 h seasonal naive's forecast of this hour, from the history the run was fitted
    # on (the same hour one or more days before the issue time); None when that hour is
    # before the series starts.
    naive24 = models.FloatField(null=True, blank=True)
    actual = models.FloatField(null=True, blank=True)  # GPUs, recorded after the hour ended

    class Meta:
        ordering = ["run_id", "ts"]
        constraints = [
            models.UniqueConstraint(fields=["run", "ts"], name="forecastpoint_unique_hour"),
            models.CheckConstraint(
                condition=Q(lower80__lte=F("yhat")) & Q(yhat__lte=F("upper80")), name="forecastpoint_ordered"
            ),
            models.CheckConstraint(
                condition=Q(upper95__isnull=True) | Q(upper95__gte=F("upper80")),
                name="forecastpoint_upper95_above_upper80",
            ),
        ]
        indexes = [
            # The hourly task looks for past hours that still wait for their actual.
            models.Index(fields=["ts"], condition=Q(actual__isnull=True), name="forecastpoint_awaiting"),
        ]

    def __str__(self) -> str:
        return f"{self.ts:%Y-%m-%d %H:%M} {self.yhat:.1f} [{self.lower80:.1f}, {self.upper80:.1f}]"


class RunStatus(models.TextChoices):
    """Where a background run stands (a what-if, a capacity-exceed run): one set of states."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class CapacityStudy(models.Model):
    """A what-if: the lab's finished jobs of one GPU type replayed twice in the simulator, once
    as the cluster is (``baseline``) and once with GPUs added or removed and maybe another
    policy (``whatif``).  The staff capacity page starts one, a Celery task runs it and stores
    each replay's result as it finishes; the page polls the row."""

    Status = RunStatus

    cluster = models.ForeignKey(
        "scheduling.Cluster", on_delete=models.CASCADE, related_name="capacity_studies"
    )
    gpu_type = models.ForeignKey("scheduling.GpuType", on_delete=models.CASCADE, related_name="+")
    gpu_delta = models.IntegerField()  # GPUs added (+) or removed (-) in the what-if
    policy = models.CharField(max_length=16)  # the what-if's policy
    # The cluster as it was when the what-if was asked for: what the baseline replays.
    baseline_policy = models.CharField(max_length=16)
    current_gpus = models.PositiveIntegerField()
    gpus_per_node = models.PositiveSmallIntegerField()
    history_days = models.PositiveSmallIntegerField(default=14)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # {"baseline": {...}, "whatif": {...}}: each replay's `forecasting.capacity.WaitPoint` as a
    # dict plus its "policy", written as soon as that replay is done.
    results = models.JSONField(default=dict, blank=True)
    progress = models.FloatField(default=0.0)  # 0..1, replays done / replays planned
    message = models.CharField(max_length=500, blank=True, default="")
    jobs = models.PositiveIntegerField(default=0)  # jobs replayed
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "capacity studies"
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=1), name="capacitystudy_progress"
            ),
        ]

    def __str__(self) -> str:
        sign = "+" if self.gpu_delta >= 0 else ""
        return f"What-if {self.pk}: {self.gpu_type_id} {sign}{self.gpu_delta} GPUs, {self.policy}"


class CapacityExceedRun(models.Model):
    """The "when does demand exceed capacity" of one cluster: one forecast fit per GPU type
    (``forecasting.capacity.capacity_exceed_when``), asked for on the staff capacity page and
    run by a Celery task that stores its progress (GPU types fitted of all) and, when done,
    each type's crossing; the page polls the row."""

    Status = RunStatus

    cluster = models.ForeignKey(
        "scheduling.Cluster", on_delete=models.CASCADE, related_name="capacity_exceed_runs"
    )
    horizon_days = models.PositiveSmallIntegerField()
    model_name = models.CharField(max_length=40, default="prophet")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    types_total = models.PositiveSmallIntegerField(default=0)  # GPU types to fit (0: not started)
    types_done = models.PositiveSmallIntegerField(default=0)
    # Per GPU type in name order: `forecasting.capacity.CapacityCrossing.as_dict()`, when done.
    results = models.JSONField(default=list, blank=True)
    message = models.CharField(max_length=500, blank=True, default="")  # why it failed
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(horizon_days__gte=1) & Q(horizon_days__lte=90), name="capacityexceedrun_horizon"
            ),
            models.CheckConstraint(
                condition=Q(types_done__lte=F("types_total")), name="capacityexceedrun_progress"
            ),
        ]

    def __str__(self) -> str:
        return f"Exceed run {self.pk}: cluster {self.cluster_id}, {self.horizon_days} days, {self.status}"
