"""Forms of the staff pages: they parse input; the services decide (their errors map onto fields)."""

from __future__ import annotations

from typing import Any

from django import forms

from ops.services import POLICY_NAMES

RANGE_DAYS = ((1, "Last day"), (7, "Last 7 days"), (30, "Last 30 days"), (90, "Last 90 days"))
MAX_HOURLY_DAYS = 7
POLICY_CHOICES = tuple((n, n) for n in POLICY_NAMES)


class RangeForm(forms.Form):
    coarsened = False  # True when an hourly request over a long range was turned into daily
    cluster = forms.TypedChoiceField(coerce=int, label="Cluster")
    days = forms.TypedChoiceField(coerce=int, choices=RANGE_DAYS, initial=7, label="Range")
    bucket = forms.ChoiceField(
        choices=(("hour", "Hourly"), ("day", "Daily")),
        initial="day",
        label="Per",
        help_text=f"Hourly for up to {MAX_HOURLY_DAYS} days.",
    )

    def __init__(self, *args: Any, clusters: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cluster_field = self.fields["cluster"]
        assert isinstance(cluster_field, forms.ChoiceField)
        cluster_field.choices = [(c.pk, c.name) for c in clusters]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # Hourly over more than a week is hundreds of bars and a slow page: per day instead.
        if data.get("bucket") == "hour" and data.get("days", 0) > MAX_HOURLY_DAYS:
            data["bucket"] = "day"
            self.coarsened = True
        return data


class QuotaForm(forms.Form):
    guaranteed_gpus = forms.IntegerField(label="Guaranteed GPUs", min_value=0, max_value=100_000)
    borrow_limit_gpus = forms.IntegerField(
        label="Borrow limit (GPUs)",
        min_value=0,
        max_value=100_000,
        required=False,
        help_text="Empty: no limit.",
    )

    def __init__(self, *args: Any, quota_id: int, **kwargs: Any) -> None:
        kwargs["prefix"] = f"q{quota_id}"
        super().__init__(*args, **kwargs)
        # The inputs sit in table cells; the form attribute ties them to the row's form.
        for field in self.fields.values():
            field.widget.attrs["form"] = f"quota-form-{quota_id}"


class QuotaNewForm(forms.Form):
    project = forms.TypedChoiceField(coerce=int, label="Project")
    gpu_type = forms.TypedChoiceField(coerce=int, label="GPU type")
    guaranteed_gpus = forms.IntegerField(label="Guaranteed GPUs", min_value=0, max_value=100_000, initial=0)
    borrow_limit_gpus = forms.IntegerField(
        label="Borrow limit (GPUs)",
        min_value=0,
        max_value=100_000,
        required=False,
        help_text="Empty: no limit.",
    )

    def __init__(self, *args: Any, projects: list[Any], gpu_types: list[Any], **kwargs: Any) -> None:
        kwargs["prefix"] = "new"
        super().__init__(*args, **kwargs)
        for name, choices in (("project", projects), ("gpu_type", gpu_types)):
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [(o.pk, o.name) for o in choices]


class WeightForm(forms.Form):
    fair_share_weight = forms.FloatField(label="Fair-share weight", min_value=0.001, max_value=1000)

    def __init__(self, *args: Any, project_id: int, **kwargs: Any) -> None:
        kwargs["prefix"] = f"p{project_id}"
        super().__init__(*args, **kwargs)
        self.fields["fair_share_weight"].widget.attrs["form"] = f"weight-form-{project_id}"


class PolicyForm(forms.Form):
    name = forms.ChoiceField(label="Policy", choices=POLICY_CHOICES)
    grace_s = forms.FloatField(label="Preemption grace (s)", min_value=0)
    min_runtime_s = forms.FloatField(label="Minimum runtime before preemption (s)", min_value=0)
    booking_lead_s = forms.FloatField(label="Reclaim lead before a booking (s)", min_value=0, initial=0)
    interactive_headroom = forms.CharField(
        label="Interactive headroom override",
        required=False,
        help_text='Such as "A100:2, *:1" (GPU type or * : GPUs held idle). Empty: sized from the forecast.',
    )

    def clean_interactive_headroom(self) -> list[tuple[str, int]] | None:
        raw = self.cleaned_data["interactive_headroom"].strip()
        if not raw:
            return None
        out = []
        for part in raw.split(","):
            type_name, sep, gpus = part.strip().rpartition(":")
            if not sep or not type_name or not gpus.strip().isdigit():
                raise forms.ValidationError('Write "TYPE:GPUS" pairs separated by commas, such as "A100:2".')
            out.append((type_name.strip(), int(gpus)))
        return out


class WhatIfForm(forms.Form):
    gpu_type = forms.ChoiceField(label="GPU type")
    gpu_delta = forms.IntegerField(
        label="Add (+) or remove (-) GPUs",
        initial=8,
        min_value=-100_000,
        max_value=100_000,
        help_text="Rounded to whole nodes of the cluster's usual size.",
    )
    policy = forms.ChoiceField(label="Policy", choices=POLICY_CHOICES, initial="berth")
    history_days = forms.IntegerField(label="History replayed (days)", initial=14, min_value=1, max_value=90)

    def clean_gpu_delta(self) -> int:
        delta: int = self.cleaned_data["gpu_delta"]
        if delta == 0:
            raise forms.ValidationError(
                "Add or remove at least one GPU: +0 would compare the cluster with itself."
            )
        return delta

    def __init__(self, *args: Any, gpu_types: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        type_field = self.fields["gpu_type"]
        assert isinstance(type_field, forms.ChoiceField)
        type_field.choices = [(t, t) for t in gpu_types]


class AuditFilterForm(forms.Form):
    actor = forms.CharField(label="Actor (username or user/api/admin/engine)", required=False, max_length=150)
    verb = forms.CharField(label="Verb starts with", required=False, max_length=40)
    entity_type = forms.CharField(label="Entity type", required=False, max_length=40)
    start = forms.DateField(label="From", required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(
        label="To (inclusive)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
