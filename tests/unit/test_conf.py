"""``conf``: the one DURABLE_JOBS setting, validated into a frozen object (no database)."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from durable_jobs import checks, conf
from durable_jobs.exceptions import ConfigurationError

DURATIONS = [
    "LEASE_TTL",
    "HEARTBEAT_INTERVAL",
    "SLICE_BUDGET",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_MAX",
    "ORPHAN_GRACE",
    "PENDING_TTL",
    "POLL_INTERVAL",
    "SHUTDOWN_GRACE",
    "RECONCILE_INTERVAL",
]
COUNTS = [
    "MAX_CONSECUTIVE_FAILURES",
    "MAX_MIRROR_ATTEMPTS",
    "MAX_REDRIVES_WITHOUT_COMMIT",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
]


def test_load__none_and_empty_give_the_documented_defaults():
    assert conf.load(None) == conf.load({}) == conf.Settings()
    defaults = conf.load({})
    assert defaults.LEASE_TTL == 60.0 and defaults.HEARTBEAT_INTERVAL < defaults.LEASE_TTL
    assert defaults.NOTIFY_CHANNEL == "durable_jobs"


def test_load__the_settings_object_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.load({}).LEASE_TTL = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("LEASE_TIL", "LEASE_TTL"),
        ("LEASE_TTL_", "LEASE_TTL"),
        ("HEARTBEAT_INTERVALL", "HEARTBEAT_INTERVAL"),
        ("MAX_CONSECUTIVE_FAILURE", "MAX_CONSECUTIVE_FAILURES"),
    ],
)
def test_load__an_unknown_key_is_refused_with_a_did_you_mean(key, suggestion):
    with pytest.raises(ConfigurationError) as caught:
        conf.load({key: 1})
    message = str(caught.value)
    assert repr(key) in message
    assert f"did you mean {suggestion!r}" in message


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("lease_ttl", "LEASE_TTL"),
        ("Slice_Budget", "SLICE_BUDGET"),
        ("heartbeat_intervall", "HEARTBEAT_INTERVAL"),
    ],
)
def test_load__a_lower_case_key_gets_the_upper_case_setting_as_its_did_you_mean(key, suggestion):
    with pytest.raises(ConfigurationError) as caught:
        conf.load({key: 1})
    assert f"unknown key {key!r}; did you mean {suggestion!r}?" in str(caught.value)


def test_system_check__names_every_unknown_key_in_an_error_of_its_own():
    with override_settings(DURABLE_JOBS={"LEASE_TT": 5, "lease_ttl": 5, "BANANA": 1}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["durable_jobs.E001"] * 3
    assert [e.msg for e in errors] == [
        "DURABLE_JOBS has an unknown key 'LEASE_TT'; did you mean 'LEASE_TTL'?",
        "DURABLE_JOBS has an unknown key 'lease_ttl'; did you mean 'LEASE_TTL'?",
        "DURABLE_JOBS has an unknown key 'BANANA'",
    ]


def test_load__an_unknown_key_without_a_near_match_is_named_without_a_guess():
    with pytest.raises(ConfigurationError) as caught:
        conf.load({"BANANA": 1})
    assert "'BANANA'" in str(caught.value) and "did you mean" not in str(caught.value)


@pytest.mark.parametrize("raw", [[("LEASE_TTL", 1)], "LEASE_TTL=1", 5])
def test_load__refuses_anything_but_a_dict(raw):
    with pytest.raises(ConfigurationError):
        conf.load(raw)


def test_configuration_error__is_an_improperly_configured():
    with pytest.raises(ImproperlyConfigured):
        conf.load({"LEASE_TTL": -1})


@pytest.mark.parametrize(
    ("heartbeat", "lease"),
    [(60, 60), (61, 60), (timedelta(minutes=2), 60), (10, timedelta(seconds=10))],
)
def test_load__a_heartbeat_not_below_the_lease_is_refused(heartbeat, lease):
    with pytest.raises(ConfigurationError) as caught:
        conf.load({"HEARTBEAT_INTERVAL": heartbeat, "LEASE_TTL": lease})
    assert "HEARTBEAT_INTERVAL" in str(caught.value)


def test_load__a_heartbeat_just_below_the_lease_is_accepted():
    settings = conf.load({"HEARTBEAT_INTERVAL": 59.9, "LEASE_TTL": 60})
    assert settings.HEARTBEAT_INTERVAL == 59.9


@pytest.mark.parametrize("name", DURATIONS)
def test_load__durations_accept_seconds_and_timedelta_as_float_seconds(name):
    small = {"HEARTBEAT_INTERVAL": 0.5} if name == "LEASE_TTL" else {}
    small = {"LEASE_TTL": 600} if name == "HEARTBEAT_INTERVAL" else small
    big = {"RETRY_BACKOFF_MAX": 1000} if name == "RETRY_BACKOFF_BASE" else {}
    as_delta = conf.load({name: timedelta(seconds=90, milliseconds=500), **small, **big})
    as_int = conf.load({name: 2, **small, **big})
    value = getattr(as_delta, name)
    assert value == 90.5 and type(value) is float
    assert getattr(as_int, name) == 2.0 and type(getattr(as_int, name)) is float


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize(
    "bad",
    [0, -1, timedelta(0), timedelta(seconds=-3), "10", None, True],
    ids=["zero", "negative", "zero-delta", "negative-delta", "string", "none", "bool"],
)
def test_load__durations_must_be_positive(name, bad):
    with pytest.raises(ConfigurationError) as caught:
        conf.load({name: bad})
    assert name in str(caught.value)


@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("name", ["LEASE_TTL", "ORPHAN_GRACE"])
def test_load__durations_must_be_finite(name, bad):
    with pytest.raises(ConfigurationError):
        conf.load({name: bad})


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize(
    "bad", [0, -2, 1.5, "3", True], ids=["zero", "negative", "float", "string", "bool"]
)
def test_load__counts_must_be_positive_integers(name, bad):
    with pytest.raises(ConfigurationError) as caught:
        conf.load({name: bad})
    assert name in str(caught.value)


def test_load__flags_must_be_booleans():
    with pytest.raises(ConfigurationError):
        conf.load({"REQUIRE_REGISTERED_KINDS": "yes"})
    assert conf.load({"REQUIRE_REGISTERED_KINDS": False}).REQUIRE_REGISTERED_KINDS is False


@pytest.mark.parametrize("name", ["DEFAULT_TENANT", "DEFAULT_QUEUE"])
@pytest.mark.parametrize("bad", ["", "has space", "x" * 101, "semi;colon", 7])
def test_load__default_tenant_and_queue_must_be_names(name, bad):
    with pytest.raises(ConfigurationError):
        conf.load({name: bad})


@pytest.mark.parametrize(
    "setting",
    [
        {"DEFAULT_TENANT": "default\n"},
        {"DEFAULT_QUEUE": "default\n"},
        {"NOTIFY_CHANNEL": "durable_jobs\n"},
    ],
    ids=["tenant", "queue", "channel"],
)
def test_load__names_with_a_trailing_newline_are_refused(setting):
    """Invariant 23: ``$`` would match before a final newline; the patterns must not."""
    with pytest.raises(ConfigurationError):
        conf.load(setting)


@pytest.mark.parametrize("channel", [None, "durable_jobs", "_x", "a" * 63])
def test_load__notify_channel_may_be_none_or_an_identifier(channel):
    assert conf.load({"NOTIFY_CHANNEL": channel}).NOTIFY_CHANNEL == channel


@pytest.mark.parametrize("channel", ["", "Durable", "has-dash", "1abc", "a" * 64, "x; NOTIFY y", 5])
def test_load__notify_channel_refuses_anything_else(channel):
    with pytest.raises(ConfigurationError):
        conf.load({"NOTIFY_CHANNEL": channel})


def test_load__backoff_max_below_base_is_refused():
    with pytest.raises(ConfigurationError):
        conf.load({"RETRY_BACKOFF_BASE": 10, "RETRY_BACKOFF_MAX": 5})
    assert conf.load({"RETRY_BACKOFF_BASE": 5, "RETRY_BACKOFF_MAX": 5}).RETRY_BACKOFF_MAX == 5.0


def test_load__retention_is_none_seconds_or_timedelta():
    assert conf.load({"RETENTION": None}).RETENTION is None
    assert conf.load({"RETENTION": timedelta(days=1)}).RETENTION == 86400.0
    for bad in (0, -1, "30d", True):
        with pytest.raises(ConfigurationError):
            conf.load({"RETENTION": bad})


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        (1.5, 1500),
        (timedelta(seconds=2, microseconds=400), 2000),
        (0.0004, 0),
        (0.0006, 1),
        (-3, 0),
    ],
)
def test_ms__whole_milliseconds_never_negative(duration, expected):
    assert conf.ms(duration) == expected


def test_get__rereads_a_replaced_setting():
    with override_settings(DURABLE_JOBS={"LEASE_TTL": 42, "HEARTBEAT_INTERVAL": 1}):
        assert conf.get().LEASE_TTL == 42.0
    with override_settings(DURABLE_JOBS={"LEASE_TTL": 43, "HEARTBEAT_INTERVAL": 1}):
        assert conf.get().LEASE_TTL == 43.0


def test_system_check__reports_a_nonsense_setting():
    with override_settings(DURABLE_JOBS={"HEARTBEAT_INTERVAL": 30, "LEASE_TTL": 10}):
        errors = checks.check_settings()
    assert [e.id for e in errors] == ["durable_jobs.E001"]
    assert "HEARTBEAT_INTERVAL" in errors[0].msg
    with override_settings(DURABLE_JOBS={}):
        assert checks.check_settings() == []


def test_load__the_batch_and_schedule_bounds_have_defaults_and_refuse_nonsense():
    """MAX_BATCH_BYTES (start_many) and MAX_RUN_AFTER (run_after's ceiling, at most 100 years)."""
    defaults = conf.load({})
    assert defaults.MAX_BATCH_BYTES == 64_000_000 and defaults.MAX_RUN_AFTER == 366 * 86400.0
    tuned = conf.load({"MAX_RUN_AFTER": timedelta(days=30), "MAX_BATCH_BYTES": 1_000})
    assert (tuned.MAX_RUN_AFTER, tuned.MAX_BATCH_BYTES) == (30 * 86400.0, 1_000)
    assert (
        conf.load({"MAX_RUN_AFTER": timedelta(days=100 * 365)}).MAX_RUN_AFTER == 100 * 365 * 86400.0
    )
    for bad in (0, -1, "1 year", math.inf, timedelta(days=100 * 365 + 1)):
        with pytest.raises(ConfigurationError, match="MAX_RUN_AFTER"):
            conf.load({"MAX_RUN_AFTER": bad})
    for bad in (0, 1.5, True, "64MB"):
        with pytest.raises(ConfigurationError, match="MAX_BATCH_BYTES"):
            conf.load({"MAX_BATCH_BYTES": bad})


# --- LISTEN_DATABASE (issue 14: the listener on a direct connection behind a pooler) ---


@pytest.mark.parametrize("bad", ["nope", "", 3, ["default"]])
def test_load__listen_database_must_name_an_alias_in_databases(bad):
    with pytest.raises(ConfigurationError) as error:
        conf.load({"LISTEN_DATABASE": bad})
    assert "LISTEN_DATABASE" in str(error.value) and repr(bad) in str(error.value)
    assert "'default'" in str(error.value)  # the aliases it could have named


def test_load__listen_database_accepts_an_alias_and_none():
    assert conf.load({"LISTEN_DATABASE": "default"}).LISTEN_DATABASE == "default"
    assert conf.load({}).LISTEN_DATABASE is None


@pytest.mark.parametrize("token", ["short", "has a space in it 0123", 12345678901234567])
def test_load__a_weak_or_garbled_metrics_token_is_refused_naming_the_setting(token):
    with pytest.raises(ConfigurationError, match="METRICS_TOKEN"):
        conf.load({"METRICS_TOKEN": token})


def test_load__a_metrics_token_of_16_characters_is_kept():
    assert conf.load({"METRICS_TOKEN": "0123456789abcdef"}).METRICS_TOKEN == "0123456789abcdef"
