import json, os, pytest
from hypothesis import settings, HealthCheck
from hypothesis.stateful import run_state_machine_as_test
from tests.model import test_state_machine as T

@pytest.mark.django_db
@pytest.mark.parametrize("i", range(int(os.environ.get("RUNS", "5"))))
def test_cov(i):
    T.OUTCOMES.clear()
    run_state_machine_as_test(T.StoreMachine, settings=settings(max_examples=100, stateful_step_count=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]))
    with open(f"/tmp/cov_{os.getpid()}_{i}.json", "w") as f:
        json.dump(dict(T.OUTCOMES), f)
