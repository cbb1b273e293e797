"""portal.htmx.service_errors_add: a service's refusal lands on the form, never as a 500."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from portal.htmx import service_errors_add


class _Form(forms.Form):
    gpu_count = forms.IntegerField()
    requested_h = forms.FloatField()
    note = forms.CharField()


def _bound() -> _Form:
    form = _Form({"gpu_count": 1, "requested_h": 1.0, "note": "x"})
    assert form.is_valid()
    return form


def test_keyed_errors_go_to_their_field_and_unknown_keys_to_the_form() -> None:
    form = _bound()
    service_errors_add(form, ValidationError({"gpu_count": "Too many.", "quota": "Over quota."}))
    assert form.errors["gpu_count"] == ["Too many."]
    assert form.non_field_errors() == ["Over quota."]


def test_a_plain_refusal_goes_to_the_form() -> None:
    form = _bound()
    service_errors_add(form, ValidationError("The cluster is down."))  # no error_dict
    assert form.non_field_errors() == ["The cluster is down."]


def test_fields_narrow_what_is_shown_at_a_field_and_aliases_rename() -> None:
    form = _bound()
    service_errors_add(
        form,
        ValidationError({"note": "Too long.", "requested_s": "Too short."}),
        fields={"gpu_count"},
        aliases={"requested_s": "requested_h"},
    )
    assert form.errors["requested_h"] == ["Too short."]
    assert form.non_field_errors() == ["Too long."]
    assert "note" not in form.errors
