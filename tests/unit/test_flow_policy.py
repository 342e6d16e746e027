"""Flow control's policy values (durable_jobs.limits.policy) and the FLOW_KEYS setting:
keys by source, and nonsense refused in one line naming what was wrong."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import conf
from durable_jobs.limits import reasons
from durable_jobs.limits.policy import StartFacts, key_for


def facts(**overrides) -> StartFacts:
    base = dict(
        kind="k.sync",
        input={"account": 42, "region": {"eu": 1}},
        tenant="acme",
        organization=None,
        subject_type="shop.order",
        subject_id="7",
        queue="mail",
    )
    return StartFacts(**{**base, **overrides})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("kind", "kind:k.sync"),
        ("tenant", "tenant:acme"),
        ("queue", "queue:mail"),
        ("subject", "subject:shop.order:7"),
        ("input:account", "k.sync:account=42"),
        ("input:region", 'k.sync:region={"eu": 1}'),
    ],
)
def test_key_for__names_the_key_by_its_source(source, expected):
    assert key_for(durable.FlowControl(key=source), facts()) == expected


def test_key_for__a_missing_field_or_subject_means_no_limit():
    assert key_for(durable.FlowControl(key="input:missing"), facts()) is None
    assert key_for(durable.FlowControl(key="subject"), facts(subject_type=None)) is None


def test_key_for__a_callable_key_is_taken_as_it_is():
    flow = durable.FlowControl(key=lambda f: f"api:{f.input['account'] % 2}")
    assert key_for(flow, facts()) == "api:0"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"key": "everything"}, "FlowControl key 'everything'"),
        ({"concurrency": 0}, "concurrency must be an int >= 1"),
        ({"weight": -1}, "weight must be a positive number"),
        ({"rate": 5}, "rate must be a durable_jobs.Rate"),
    ],
)
def test_flow_control__refuses_nonsense(arguments, message):
    with pytest.raises(durable.ConfigurationError, match=message):
        durable.FlowControl(**arguments)


def test_rate__refuses_a_zero_limit_or_window():
    with pytest.raises(durable.ConfigurationError, match="limit"):
        durable.Rate(limit=0)
    with pytest.raises(durable.ConfigurationError, match="per"):
        durable.Rate(limit=1, per=0)


def test_flow_keys_setting__is_checked_and_frozen():
    settings = conf.load({"FLOW_KEYS": {"tenant:acme": {"concurrency": 5, "weight": 3}}})
    assert settings.FLOW_KEYS["tenant:acme"]["concurrency"] == 5
    with pytest.raises(durable.ConfigurationError, match=r"FLOW_KEYS.*'tenant:acme'.*concurrency"):
        conf.load({"FLOW_KEYS": {"tenant:acme": {"concurrency": 0}}})
    with pytest.raises(durable.ConfigurationError, match="must be a dict of concurrency"):
        conf.load({"FLOW_KEYS": {"tenant:acme": {"speed": 1}}})


def test_reason__is_frozen_data_with_a_sentence():
    reason = durable.Reason(code=reasons.RATE_LIMITED, sentence="Wait.", fields={"limit": 3})
    assert reason.blocks_claim and reason.as_dict() == {
        "code": "rate_limited",
        "sentence": "Wait.",
        "fields": {"limit": 3},
    }
    with pytest.raises(TypeError):
        reason.fields["limit"] = 4  # type: ignore[index]


def test_flow_keys_setting__takes_back_the_frozen_mapping_a_loaded_setting_carries():
    """A setting rebuilt from the loaded one (an override that copies every field) passes."""
    loaded = conf.load({"FLOW_KEYS": {"tenant:acme": {"concurrency": 5}}})
    again = conf.load({"FLOW_KEYS": loaded.FLOW_KEYS})
    assert again.FLOW_KEYS == loaded.FLOW_KEYS
    with pytest.raises(durable.ConfigurationError, match="must be a dict of flow key"):
        conf.load({"FLOW_KEYS": [("tenant:acme", {"concurrency": 5})]})
