"""Scheduling data model: inventory, bookings, jobs, GPU allocations and the audit trail.

Invariants held by the database itself (DESIGN §3):

* **No GPU is allocated twice at any instant.**  ``Allocation`` carries a btree_gist
  exclusion constraint ``(gpu WITH =, period WITH &&)`` over every allocation that is not
  ``released``.  Periods are half-open ``[start, end)``, so back-to-back windows do not clash.
* How allocations leave the constraint:

  - work that **ends** (a booking ended early or cancelled after its start, a job that
    finished, failed, was cancelled or preempted) keeps its allocation with the period
    truncated to ``[start, ended_at)`` and state ``ended``: the history stays true and the
    future is free again;
  - an allocation that **never started** (a booking cancelled before its start, a planned
    start the engine withdrew) becomes ``released``; released rows are outside the
    constraint (a partial exclusion constraint) and kept only for history;
  - a running job whose end is unknown holds an open-ended period ``[start, )`` or an
    expected-end period that the engine extends; either way it blocks overlapping bookings.

* An allocation belongs to exactly one holder: a booking or a job (a check constraint).

Nothing happens in ``save()`` or signals: every write goes through ``scheduling.services``.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models import F, Q


def _default_precisions() -> list[str]:
    return ["fp32", "tf32", "bf16", "fp16"]


class GpuType(models.Model):
    name = models.CharField(max_length=40, unique=True)
    memory_gib = models.FloatField(default=80.0)
    precisions = ArrayField(models.CharField(max_length=16), default=_default_precisions, blank=True)
    # Throughput relative to the reference type (1.0).
    relative_speed = models.FloatField(default=1.0)
    # Fair-share weight of one GPU-hour of this type.
    value = models.FloatField(default=1.0)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(memory_gib__gt=0), name="gputype_memory_positive"),
            models.CheckConstraint(condition=Q(relative_speed__gt=0), name="gputype_speed_positive"),
            models.CheckConstraint(condition=Q(value__gt=0), name="gputype_value_positive"),
        ]

    def __str__(self) -> str:
        return self.name


class Cluster(models.Model):
    class Backend(models.TextChoices):
        SIMULATOR = "simulator", "Simulator"
        SLURM = "slurm", "Slurm"
        KUBERNETES = "kubernetes", "Kubernetes"

    name = models.CharField(max_length=60, unique=True)
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.SIMULATOR)
    # Backend connection settings (URLs, partition, namespace); never secrets, which come from env.
    settings = models.JSONField(default=dict, blank=True)
    is_active = models.BooleanField(default=True)
    is_degraded = models.BooleanField(default=False)
    status_message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    class Status(models.TextChoices):
        UP = "up", "Up"
        DRAINING = "draining", "Draining"
        DOWN = "down", "Down"

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=120)
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="nodes")
    gpu_count = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.UP)
    # Topology domain (NVLink island, rack); "" when unknown.
    domain = models.CharField(max_length=120, blank=True, default="")

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_cluster_name"),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="node_gpu_count_positive"),
        ]
        indexes = [models.Index(fields=["gpu_type", "cluster", "status"], name="node_type_cluster_status")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}" if self.cluster_id else self.name


class Gpu(models.Model):
    """One physical GPU.  Its primary key is the engine's GPU id (unique per snapshot)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index")]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.index}"


class Booking(models.Model):
    """An interactive window of ``gpu_count`` GPUs of one type, ``[start_at, end_at)``."""

    class Status(models.TextChoices):
        CONFIRMED = "confirmed", "Confirmed"
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"
        CANCELLED = "cancelled", "Cancelled"
        # No FAILED: nothing makes a booking fail (a backend that cannot hold it marks it at risk
        # and the status message says why); migration 0004 removed the unused choice.

    OPEN_STATUSES = (Status.CONFIRMED, Status.ACTIVE)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="bookings")
    project = models.ForeignKey("accounts.Project", on_delete=models.PROTECT, related_name="bookings")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="bookings")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="bookings")
    gpu_count = models.PositiveSmallIntegerField()
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONFIRMED)
    note = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When it really ended (end early / cancel / completion); None while open.
    ended_at = models.DateTimeField(null=True, blank=True)
    status_message = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["-start_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(end_at__gt=F("start_at")), name="booking_end_after_start"),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="booking_gpu_count_positive"),
        ]
        indexes = [
            models.Index(fields=["user", "-start_at"], name="booking_user_start"),
            models.Index(fields=["project", "-start_at"], name="booking_project_start"),
            models.Index(fields=["cluster", "status", "start_at"], name="booking_cluster_status_start"),
        ]

    def __str__(self) -> str:
        return f"Booking {self.pk}: {self.gpu_count}x{self.gpu_type_id} {self.start_at:%Y-%m-%d %H:%M}"


class Job(models.Model):
    """A batch job (or on-demand interactive session) waiting for or running on GPUs."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        # No PREEMPTED: a preempted job is requeued (PENDING, with its preemption recorded in
        # Preemption and the job's events); migration 0004 removed the unused choice.

    class Kind(models.TextChoices):
        BATCH = "batch", "Batch"
        INTERACTIVE = "interactive", "Interactive"

    class Priority(models.IntegerChoices):
        LOW = -10, "Low"
        NORMAL = 0, "Normal"
        HIGH = 10, "High"

    class PendingReason(models.TextChoices):
        # Mirrors scheduling.engine.types.PendingReason (a test keeps them equal).
        NONE = "", "None"
        RESOURCES = "resources", "Resources"
        PRIORITY = "priority", "Priority"
        RESERVATION = "reservation", "Reservation"
        FRAGMENTATION = "fragmentation", "Fragmentation"
        CONSTRAINT = "constraint", "Constraint"
        QUOTA = "quota", "Quota"
        PREEMPTING = "preempting", "Preempting"
        HEADROOM = "headroom", "Headroom"
        BACKEND = "backend", "Backend"

    OPEN_STATUSES = (Status.PENDING, Status.STARTING, Status.RUNNING)

    # No index of their own: each leads a composite index below (migration 0008).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    project = models.ForeignKey(
        "accounts.Project", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.BATCH)
    gpu_count = models.PositiveSmallIntegerField()
    # None: any type that satisfies the memory and precision constraints.
    gpu_type = models.ForeignKey(
        GpuType, on_delete=models.PROTECT, related_name="jobs", null=True, blank=True
    )
    min_memory_gib = models.FloatField(default=0.0)
    precisions = ArrayField(models.CharField(max_length=16), default=list, blank=True)
    requested_s = models.PositiveIntegerField(null=True, blank=True)  # the user's runtime estimate
    predicted_p50_s = models.FloatField(null=True, blank=True)
    predicted_p90_s = models.FloatField(null=True, blank=True)
    is_preemptible = models.BooleanField(default=False)
    is_checkpointable = models.BooleanField(default=False)
    checkpoint_interval_s = models.PositiveIntegerField(null=True, blank=True)
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    # What the backend runs: {"command": ..., "script": ..., "image": ..., "env": {...}}.
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    submitted_at = models.DateTimeField()
    first_submitted_at = models.DateTimeField(null=True, blank=True)  # kept across requeues
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=0)  # times preempted and requeued
    # Not a column: queued seconds over every attempt, set for pages by `selectors.jobs_waits_set`.
    waited_s: float | None
    # The engine's explanation for a pending job (DESIGN §3.5).
    pending_reason = models.CharField(max_length=16, choices=PendingReason.choices, blank=True, default="")
    pending_sentence = models.CharField(max_length=500, blank=True, default="")
    eta_p50_at = models.DateTimeField(null=True, blank=True)
    eta_p90_at = models.DateTimeField(null=True, blank=True)
    backend_ref = models.CharField(max_length=200, blank=True, default="")
    status_message = models.CharField(max_length=500, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="job_gpu_count_positive"),
            models.CheckConstraint(condition=Q(min_memory_gib__gte=0), name="job_min_memory_nonnegative"),
            models.CheckConstraint(
                condition=Q(requested_s__isnull=True) | Q(requested_s__gt=0), name="job_requested_positive"
            ),
        ]
        indexes = [
            models.Index(fields=["user", "-submitted_at"], name="job_user_submitted"),
            models.Index(fields=["project", "-submitted_at"], name="job_project_submitted"),
            models.Index(fields=["cluster", "status", "submitted_at"], name="job_cluster_status_submitted"),
        ]

    def __str__(self) -> str:
        return f"Job {self.pk} {self.name}"

    @property
    def is_never_startable(self) -> bool:
        """Pending with a reason no waiting removes (`engine.startability`: its sentences start
        with "Cannot start:"), so no start estimate is honest."""
        return self.status == self.Status.PENDING and self.pending_sentence.startswith("Cannot start:")


class Allocation(models.Model):
    """One GPU held by one booking or job over a half-open period ``[lower, upper)``."""

    class State(models.TextChoices):
        PLANNED = "planned", "Planned"  # held for a future start (booking or reserved job)
        ACTIVE = "active", "Active"  # in use now
        ENDED = "ended", "Ended"  # period truncated to when it really ended
        RELEASED = "released", "Released"  # never used; outside the exclusion constraint

    BLOCKING_STATES = (State.PLANNED, State.ACTIVE, State.ENDED)

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    booking = models.ForeignKey(
        Booking, on_delete=models.CASCADE, related_name="allocations", null=True, blank=True
    )
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations", null=True, blank=True)
    period = DateTimeRangeField()
    # Runs on lent or borrowed capacity and may be reclaimed (DESIGN §3.3-3.4).
    is_preemptible = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNED)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_id", "period"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(booking__isnull=False, job__isnull=True) | Q(booking__isnull=True, job__isnull=False)
                ),
                name="allocation_exactly_one_holder",
            ),
            models.CheckConstraint(condition=Q(period__isempty=False), name="allocation_period_not_empty"),
            ExclusionConstraint(
                name="allocation_no_gpu_overlap",
                expressions=[("gpu", RangeOperators.EQUAL), ("period", RangeOperators.OVERLAPS)],
                condition=~Q(state="released"),
                violation_error_message="This GPU is already allocated during that period.",
            ),
        ]
        indexes = [
            # The alternatives search reads blocking allocations in start order (bounded reads).
            models.Index(
                models.Func(models.F("period"), function="lower", output_field=models.DateTimeField()),
                name="allocation_lower_blocking",
                condition=~Q(state="released"),
            ),
        ]

    def __str__(self) -> str:
        holder = f"booking {self.booking_id}" if self.booking_id else f"job {self.job_id}"
        return f"GPU {self.gpu_id} for {holder} {self.period}"


class EngineRound(models.Model):
    """One run of the allocation engine for a cluster: its latency, decisions and any error."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="engine_rounds")
    policy = models.CharField(max_length=32, default="berth")
    started_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True, blank=True)
    # Summary of the plan: counts of starts/preemptions/…, idle GPUs by reason, notes.
    decisions = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["cluster", "-started_at"], name="engineround_cluster_started")]

    def __str__(self) -> str:
        return f"Round {self.pk} on {self.cluster_id} at {self.started_at:%H:%M:%S}"


class Preemption(models.Model):
    """A running preemptible job reclaimed for higher-class demand, with the work it lost."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="preemptions")
    engine_round = models.ForeignKey(
        EngineRound, on_delete=models.SET_NULL, related_name="preemptions", null=True, blank=True
    )
    # For whom the GPUs are reclaimed (at most one of the two).
    for_booking = models.ForeignKey(
        Booking, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    for_job = models.ForeignKey(Job, on_delete=models.SET_NULL, related_name="+", null=True, blank=True)
    signalled_at = models.DateTimeField()
    kill_at = models.DateTimeField()  # planned end of the grace period
    killed_at = models.DateTimeField(null=True, blank=True)  # when it really stopped
    lost_gpu_s = models.FloatField(default=0.0)  # GPU-seconds of work since the last checkpoint
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["-signalled_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kill_at__gte=F("signalled_at")), name="preemption_kill_after_signal"
            ),
            models.CheckConstraint(
                condition=Q(for_booking__isnull=True) | Q(for_job__isnull=True),
                name="preemption_at_most_one_beneficiary",
            ),
        ]
        indexes = [models.Index(fields=["-signalled_at"], name="preemption_signalled")]

    def __str__(self) -> str:
        return f"Preemption of job {self.job_id} at {self.signalled_at:%Y-%m-%d %H:%M}"


class AuditEvent(models.Model):
    """Every state change of a booking, job or allocation, and who or what caused it (DESIGN §3.6)."""

    class Actor(models.TextChoices):
        USER = "user", "User"  # a person through the browser
        API = "api", "API"  # a person or script through the REST API
        ADMIN = "admin", "Admin"  # Django admin or a management command
        ENGINE = "engine", "Engine"  # the allocation engine / reconciler

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+", null=True, blank=True
    )
    actor_label = models.CharField(max_length=16, choices=Actor.choices)
    verb = models.CharField(max_length=40)  # "booking.create", "job.cancel", "allocation.truncate", …
    entity_type = models.CharField(max_length=40)  # "booking" | "job" | "allocation" | …
    entity_id = models.BigIntegerField()
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["entity_type", "entity_id"], name="audit_entity"),
            models.Index(fields=["-at"], name="audit_at"),
            models.Index(fields=["actor", "-at"], name="audit_actor_at"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.verb} {self.entity_type}:{self.entity_id}"
        )


class IdempotencyKey(models.Model):
    """The stored answer of an API write sent with an ``Idempotency-Key`` header (docs/api.md).

    Inserted in the same transaction as the write it answers, so a key is stored exactly when
    its write is: a client that lost the answer (the connection, or PostgreSQL, died at the
    COMMIT) retries with the same key and gets this answer back instead of writing twice.
    ``(user, key)`` is unique: of two concurrent requests with one key, the second waits on the
    first's row and then replays its answer.  Rows expire after ``BERTH_IDEMPOTENCY_TTL_S``
    (``scheduling.tasks.idempotency_keys_clean`` deletes them).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # sha256 of method, path and canonical JSON body: the same key with another request is refused.
    fingerprint = models.CharField(max_length=64)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=2000)
    status_code = models.PositiveSmallIntegerField()
    # The JSON text answered, byte for byte (jsonb would reorder the keys).
    body = models.TextField()
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} key {self.key[:40]} ({self.status_code})"
