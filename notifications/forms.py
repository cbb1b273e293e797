"""Forms of the notification preferences page."""

from __future__ import annotations

from typing import Any

from django import forms

from notifications.models import EventKind
from portal.accounts.models import Project


class PreferenceForm(forms.Form):
    is_email_enabled = forms.BooleanField(required=False, label="Send me e-mail")
    email_events = forms.MultipleChoiceField(
        choices=EventKind.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="E-mail me about",
    )
    booking_start_lead_min = forms.IntegerField(
        min_value=0, max_value=10_080, label="Remind me before a booking starts (minutes, 0: never)"
    )
    booking_end_lead_min = forms.IntegerField(
        min_value=0, max_value=10_080, label="Warn me before a booking ends (minutes, 0: never)"
    )


class WebhookForm(forms.Form):
    url = forms.URLField(max_length=500, label="Receiver URL", assume_scheme="https")
    project = forms.ModelChoiceField(
        queryset=Project.objects.none(),
        required=False,
        empty_label="Only my own work",
        label="Events of",
        help_text="A project's webhook receives the events of all of its work (project managers only).",
    )

    def __init__(self, *args: Any, projects: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["project"].queryset = projects  # type: ignore[attr-defined]
