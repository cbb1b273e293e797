"""Browser forms: they parse and check input; the services decide and write."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.db.models import QuerySet
from django.utils import timezone

from portal.accounts.models import Project
from scheduling.models import GpuType

# <input type="datetime-local"> sends "2026-11-30T14:15" (no seconds, no zone).
DATETIME_LOCAL_FORMAT = "%Y-%m-%dT%H:%M"
DURATION_CHOICES = (
    ("0.5", "30 minutes"),
    ("1", "1 hour"),
    ("2", "2 hours"),
    ("4", "4 hours"),
    ("8", "8 hours"),
    ("12", "12 hours"),
    ("24", "1 day"),
    ("72", "3 days"),
)
DEFAULT_DURATION_H = "2"
MAX_GPUS_PER_BOOKING = 64


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs=attrs, format=DATETIME_LOCAL_FORMAT)


def next_quarter_hour(now: datetime) -> datetime:
    """The next quarter-hour boundary after ``now`` (a sensible default start)."""
    base = now.replace(second=0, microsecond=0)
    return base + timedelta(minutes=15 - base.minute % 15)


class BookingForm(forms.Form):
    """Book a GPU window: project, GPU type, count, start, and an end or a duration.

    ``end_at`` wins over ``duration_h`` when both are given; ``window()`` returns the pair.
    Times are read in the site time zone (UTC by default) and are aware after cleaning.
    """

    # Chosen by slug and name (not id), so availability links read well and survive a reset.
    project = forms.ModelChoiceField(queryset=Project.objects.none(), empty_label=None, to_field_name="slug")
    gpu_type = forms.ModelChoiceField(
        queryset=GpuType.objects.none(), empty_label=None, to_field_name="name", label="GPU type"
    )
    gpu_count = forms.IntegerField(
        label="GPUs",
        min_value=1,
        max_value=MAX_GPUS_PER_BOOKING,
        initial=1,
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    start_at = forms.DateTimeField(
        label="Start",
        input_formats=[DATETIME_LOCAL_FORMAT, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
        widget=DateTimeLocalInput(),
    )
    duration_h = forms.TypedChoiceField(
        label="Duration",
        choices=DURATION_CHOICES,
        coerce=float,
        empty_value=None,
        initial=DEFAULT_DURATION_H,
        required=False,
    )
    end_at = forms.DateTimeField(
        label="Or an exact end",
        required=False,
        input_formats=[DATETIME_LOCAL_FORMAT, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
        widget=DateTimeLocalInput(),
        help_text="Optional; overrides the duration.",
    )
    note = forms.CharField(
        required=False,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="What the window is for (shown to admins).",
    )

    def __init__(
        self,
        *args: Any,
        projects: QuerySet[Project],
        gpu_types: QuerySet[GpuType],
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("label_suffix", "")  # labels read "GPUs", not "GPUs:"
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects  # type: ignore[attr-defined]
        self.fields["gpu_type"].queryset = gpu_types  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        start_at: datetime | None = cleaned.get("start_at")
        end_at: datetime | None = cleaned.get("end_at")
        duration_h: float | None = cleaned.get("duration_h")
        if start_at is None:
            return cleaned
        if end_at is None:
            if not duration_h:
                self.add_error("duration_h", "Choose a duration or give an end.")
                return cleaned
            end_at = start_at + timedelta(hours=duration_h)
        if end_at <= start_at:
            self.add_error("end_at", "The end must be after the start.")
            return cleaned
        cleaned["end_at"] = end_at
        return cleaned

    def window(self) -> tuple[datetime, datetime]:
        """``(start_at, end_at)`` of a valid form, both aware."""
        return self.cleaned_data["start_at"], self.cleaned_data["end_at"]


def booking_form_initial(
    *, project_slug: str | None, gpu_type_name: str | None, now: datetime | None = None
) -> dict[str, str]:
    """Values of an empty booking form, as submitted strings: the next quarter hour, two
    hours, one GPU.  Being strings, they serve both as ``initial`` and as data to preview
    availability before the user changes anything.
    """
    # The quarter hour in real time, then shown locally: on the wall clock of a zone with
    # summer time, 01:50 + 10 min is 02:00 on the night that skips it, a start the form refuses.
    start = timezone.localtime(next_quarter_hour(now or timezone.now()))
    initial = {
        "start_at": start.strftime(DATETIME_LOCAL_FORMAT),
        "duration_h": DEFAULT_DURATION_H,
        "gpu_count": "1",
    }
    if project_slug:
        initial["project"] = project_slug
    if gpu_type_name:
        initial["gpu_type"] = gpu_type_name
    return initial


PRECISION_CHOICES = (
    ("fp64", "FP64"),
    ("tf32", "TF32"),
    ("bf16", "BF16"),
    ("fp16", "FP16"),
    ("fp8", "FP8"),
)


class JobForm(forms.Form):
    """Submit a batch job: what it needs (GPUs, type or constraints), how long, and what to run.

    The runtime estimate is entered in hours and handed to the service in seconds
    (``requested_s()``); the command becomes the job's payload.
    """

    project = forms.ModelChoiceField(queryset=Project.objects.none(), empty_label=None, to_field_name="slug")
    name = forms.CharField(max_length=200, help_text="Shown in your job list, e.g. resnet50-lr-sweep.")
    gpu_count = forms.IntegerField(
        label="GPUs",
        min_value=1,
        max_value=MAX_GPUS_PER_BOOKING,
        initial=1,
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
    gpu_type = forms.ModelChoiceField(
        queryset=GpuType.objects.none(),
        required=False,
        empty_label="Any type that fits",
        to_field_name="name",
        label="GPU type",
    )
    min_memory_gib = forms.FloatField(
        label="Minimum GPU memory (GiB)",
        min_value=0,
        max_value=1024,
        required=False,
        initial=0,
    )
    precisions = forms.MultipleChoiceField(
        choices=PRECISION_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Needs precisions",
        help_text="Only GPU types that support all of these.",
    )
    requested_h = forms.FloatField(
        label="Runtime estimate (hours)",
        min_value=0.01,
        max_value=24 * 30,
        initial=1,
        help_text="Used for backfill until Berth has learned your jobs' real runtimes.",
    )
    is_preemptible = forms.BooleanField(
        label="Preemptible",
        required=False,
        help_text="May run on lent or borrowed GPUs and be stopped (after a grace period) to return them.",
    )
    is_checkpointable = forms.BooleanField(
        label="Checkpoints",
        required=False,
        help_text="Resumes from its last checkpoint after a preemption.",
    )
    checkpoint_interval_min = forms.IntegerField(
        label="Checkpoint every (minutes)",
        min_value=1,
        max_value=24 * 60,
        required=False,
    )
    command = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="What the backend runs, e.g. python train.py --config configs/base.yaml",
    )

    def __init__(
        self,
        *args: Any,
        projects: QuerySet[Project],
        gpu_types: QuerySet[GpuType],
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects  # type: ignore[attr-defined]
        self.fields["gpu_type"].queryset = gpu_types  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("checkpoint_interval_min") and not cleaned.get("is_checkpointable"):
            self.add_error(
                "checkpoint_interval_min", "Only a job that checkpoints has a checkpoint interval."
            )
        return cleaned

    def requested_s(self) -> int:
        """The runtime estimate in whole seconds."""
        hours: float = self.cleaned_data["requested_h"]
        return max(1, round(hours * 3600))

    def checkpoint_interval_s(self) -> int | None:
        """The checkpoint interval in seconds, or ``None`` when not given."""
        minutes: int | None = self.cleaned_data.get("checkpoint_interval_min")
        return minutes * 60 if minutes else None
