"""``durable.Unique``: what a unique start compares, and one-line refusals of nonsense."""

from __future__ import annotations

from datetime import timedelta

import pytest

import durable_jobs as durable
from durable_jobs import unique
from durable_jobs.exceptions import ConfigurationError, InvalidInput


def test_unique__defaults_to_the_whole_input_over_live_jobs():
    rule = durable.Unique()
    assert (rule.fields, rule.period, rule.states) == (None, None, ("pending", "running"))


def test_unique__a_period_covers_completed_jobs_unless_told_which_finished_states():
    assert durable.Unique(period=3600).states == ("pending", "running", "completed")
    assert durable.Unique(period=timedelta(days=1)).period_ms == 86_400_000
    chosen = durable.Unique(period=60, states=["failed", "running", "pending", "completed"])
    assert chosen.states == ("pending", "running", "completed", "failed")


def test_unique__true_and_a_list_of_fields_are_shorthands():
    assert unique.coerce("unique", True) == durable.Unique()
    assert unique.coerce("unique", ["b", "a"]) == durable.Unique(fields=("a", "b"))
    assert unique.coerce("unique", None) is None
    assert unique.coerce("unique", False) is False


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: durable.Unique(fields=[]), "unique.fields: is empty"),
        (lambda: durable.Unique(fields="customer"), "unique.fields: must be a list"),
        (lambda: durable.Unique(fields=["a", "a"]), "unique.fields: names a key twice"),
        (lambda: durable.Unique(fields=["a", 3]), "unique.fields: must hold non-empty strings"),
        (lambda: durable.Unique(period=0.5), "unique.period: must be whole seconds"),
        (lambda: durable.Unique(period=400 * 86400), "unique.period: must be whole seconds"),
        (lambda: durable.Unique(period="1h"), "unique.period: must be seconds or a timedelta"),
        (lambda: durable.Unique(states=["completed"]), "unique.states: must include pending"),
        (lambda: durable.Unique(states=["pending", "running", "done"]), "unknown statuses"),
        (
            lambda: durable.Unique(states=["pending", "running", "completed"]),
            "finished states need a period",
        ),
        (
            lambda: durable.Unique(period=60, states=["pending", "running"]),
            "a period needs a finished state",
        ),
        (lambda: unique.coerce("unique", "yes"), "unique: must be True, a list of input keys"),
        (lambda: unique.coerce("unique", []), "unique: is empty"),
    ],
)
def test_unique__refuses_nonsense_with_one_line_naming_the_field(build, names):
    with pytest.raises(InvalidInput) as caught:
        build()
    assert names in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unique__a_registration_with_a_bad_unique_is_a_configuration_error():
    with pytest.raises(ConfigurationError) as caught:
        durable.handler("tests.bad_unique", unique="yes")(lambda job: durable.DONE)
    assert "handler 'tests.bad_unique' unique: must be True" in str(caught.value)


def test_unique__the_key_ignores_key_order_and_unselected_fields_but_not_scope_or_kind():
    rule = durable.Unique(fields=["customer"])
    key = unique.key(rule, "k", "t", None, {"customer": 1, "note": "a"})
    assert key == unique.key(rule, "k", "t", None, {"note": "b", "customer": 1})
    assert key != unique.key(rule, "k", "t", "org", {"customer": 1})
    assert key != unique.key(rule, "k", "t2", None, {"customer": 1})
    assert key != unique.key(rule, "k2", "t", None, {"customer": 1})
    assert key != unique.key(rule, "k", "t", None, {"customer": 2})
    # A missing field is not a null one.
    assert unique.key(rule, "k", "t", None, {}) != unique.key(
        rule, "k", "t", None, {"customer": None}
    )
    assert key.startswith("k:") and len(key) <= 200


def test_unique__fields_need_an_object_input():
    with pytest.raises(InvalidInput, match="the input must be a JSON object"):
        unique.key(durable.Unique(fields=["a"]), "k", "t", None, [1, 2])
