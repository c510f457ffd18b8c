"""``HISPARSE_HAL_*`` numeric settings (``settings.py``): the default when unset or blank, the parsed value when
positive and finite, and a typed error quoting anything else."""

from __future__ import annotations

import pytest

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.settings import DEFAULT_EVENT_TIMEOUT_S, EVENT_TIMEOUT_ENV, event_timeout_s, positive_setting


@pytest.mark.parametrize("environ", [{}, {EVENT_TIMEOUT_ENV: ""}, {EVENT_TIMEOUT_ENV: "   "}])
def test_an_unset_or_blank_variable_gives_the_default(environ):
    assert event_timeout_s(environ) == DEFAULT_EVENT_TIMEOUT_S == 30.0


@pytest.mark.parametrize(("raw", "value"), [("2.5", 2.5), (" 7 ", 7.0), ("1e-3", 0.001)])
def test_a_positive_finite_value_is_parsed(raw, value):
    assert event_timeout_s({EVENT_TIMEOUT_ENV: raw}) == value


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "soon", "1,5"])
def test_anything_else_is_refused_quoting_the_value_and_the_default(raw):
    with pytest.raises(InvalidArgumentError) as caught:
        event_timeout_s({EVENT_TIMEOUT_ENV: raw})
    assert str(caught.value) == (f"{EVENT_TIMEOUT_ENV} must be a positive, finite number of seconds, got {raw!r}; "
                                 "unset it for the default (30.0)")


def test_integer_settings_use_their_parser_and_a_missing_default_stays_none():
    assert positive_setting("X", None, int, "a count", {}) is None
    assert positive_setting("X", None, int, "a count", {"X": "12"}) == 12
    with pytest.raises(InvalidArgumentError, match=r"X must be a count, got '1\.5'; unset it for the default \(None\)"):
        positive_setting("X", None, int, "a count", {"X": "1.5"})


def test_the_process_environment_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv(EVENT_TIMEOUT_ENV, "4")
    assert event_timeout_s() == 4.0
