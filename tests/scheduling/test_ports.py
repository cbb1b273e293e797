"""The prediction port (scheduling.ports): the one way scheduling reaches the forecasting app."""

from __future__ import annotations

import inspect

import pytest

from forecasting.port import ForecastingPredictionPort
from scheduling import ports
from scheduling.ports import PredictionPort, PredictionPortUnsetError, prediction_port, set_prediction_port


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


def test_the_forecasting_app_registers_its_port_at_start_up() -> None:
    assert isinstance(prediction_port(), ForecastingPredictionPort)


def test_the_forecasting_port_implements_every_method_of_the_protocol_with_its_signature() -> None:
    declared = _methods(PredictionPort)
    implemented = _methods(ForecastingPredictionPort)
    assert set(declared) == set(implemented)
    for name, signature in declared.items():
        assert list(signature.parameters) == list(implemented[name].parameters), name


def test_an_unset_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_port", None)
    with pytest.raises(PredictionPortUnsetError, match=r"ForecastingConfig\.ready"):
        prediction_port()


def test_a_registered_port_is_what_callers_get(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_port", ports._port)  # restored after the test
    other = ForecastingPredictionPort()
    set_prediction_port(other)
    assert prediction_port() is other
