"""DURABLE_JOBS["SCHEDULES"] and SCHEDULE_GRACE: the shape is refused at load, naming the entry
(the system check's E001); what each schedule says is the schedule check's (E004)."""

from __future__ import annotations

import pytest

from durable_jobs import conf
from durable_jobs.exceptions import ConfigurationError


def test_schedules_default_to_none_and_the_grace_to_a_minute():
    settings = conf.load({})
    assert settings.SCHEDULES is None and settings.SCHEDULE_GRACE == 60.0


def test_a_well_formed_schedules_setting_loads():
    entry = {"kind": "cleanup.run", "cron": "@daily", "tz": "UTC", "catch_up": 3}
    assert conf.load({"SCHEDULES": {"cleanup.nightly": entry}}).SCHEDULES == {
        "cleanup.nightly": entry
    }


@pytest.mark.parametrize(
    ("schedules", "says"),
    [
        (["@daily"], r"must be None or a dict"),
        ({"nightly": "@daily"}, r"\['nightly'\] must be a dict with 'kind' and 'cron'"),
        ({"nightly": {"kind": "k"}}, r"\['nightly'\] needs 'cron'"),
        ({"nightly": {"kind": "k", "cron": "@daily", "zone": "UTC"}}, r"unknown keys \['zone'\]"),
    ],
)
def test_a_garbled_schedules_setting_is_refused_naming_the_entry(schedules, says):
    with pytest.raises(ConfigurationError, match=says):
        conf.load({"SCHEDULES": schedules})


def test_the_grace_is_a_duration():
    with pytest.raises(ConfigurationError, match="SCHEDULE_GRACE"):
        conf.load({"SCHEDULE_GRACE": -1})
