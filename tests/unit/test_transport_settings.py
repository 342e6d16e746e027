"""The broker transports' settings (DURABLE_JOBS['TRANSPORT'], ['BROKER_URLS']) and the
delay a RabbitMQ message waits: every refusal is one line naming what is wrong, and a
delayed message is never delivered before its run time."""

from __future__ import annotations

import pytest

import durable_jobs as durable
from durable_jobs import conf
from durable_jobs.transports.amqp import delay_bucket

REDIS = {"redis": "redis://127.0.0.1:6379/0"}


def refusal(raw: dict) -> str:
    with pytest.raises(durable.ConfigurationError) as refused:
        conf.load(raw)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_transport_per_queue_and_a_broker_url_per_transport_in_use_are_taken():
    settings = conf.load(
        {"QUEUES": ["default", "mail"], "TRANSPORT": {"mail": "redis"}, "BROKER_URLS": REDIS}
    )
    assert conf.transport_of("mail", settings) == "redis"
    assert conf.transport_of("default", settings) == "database"


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"TRANSPORT": "kafka"}, "'kafka'"),
        ({"TRANSPORT": {"mail": "kafka"}, "BROKER_URLS": REDIS}, "'kafka'"),
        ({"TRANSPORT": ["redis"]}, "got list"),
        ({"TRANSPORT": {"no such queue!": "redis"}, "BROKER_URLS": REDIS}, "no queue names"),
        (
            {"QUEUES": ["default", "mail"], "TRANSPORT": {"mial": "redis"}, "BROKER_URLS": REDIS},
            "did you mean 'mail'?",
        ),
        ({"TRANSPORT": "redis"}, "BROKER_URLS']['redis'] must be a URL"),
        (
            {"TRANSPORT": "rabbitmq", "BROKER_URLS": {"rabbitmq": "redis://127.0.0.1"}},
            "scheme amqp or amqps",
        ),
        ({"TRANSPORT": "redis", "BROKER_URLS": "redis://127.0.0.1"}, "must be None or a dict"),
    ],
)
def test_a_transport_setting_that_cannot_deliver_is_refused_in_one_line_naming_it(raw, named):
    assert named in refusal(raw)


@pytest.mark.parametrize("delay_ms", [0, 1, 9, 10, 11, 99, 101, 999, 1001, 12_345, 86_400_001])
def test_a_delayed_message_waits_at_least_its_delay_and_at_most_one_percent_more(delay_ms):
    bucket = delay_bucket(delay_ms)
    assert bucket >= delay_ms
    assert bucket - delay_ms <= max(10, delay_ms // 100)


def test_delays_share_a_bounded_number_of_delay_queues():
    """One RabbitMQ queue per bucket: a day of distinct millisecond delays fits in a few
    thousand queues, not millions."""
    buckets = {delay_bucket(ms) for ms in range(0, 86_400_000, 997)}
    assert len(buckets) < 6_000
