import pytest

from tests.acceptance import harness


@pytest.fixture
def processes(db_url):
    """Start worker subprocesses with ``processes.worker(...)``; all are ended after the test."""

    class Bag:
        def __init__(self) -> None:
            self.started: list[harness.Process] = []

        def worker(
            self, *args: str, app_name: str = "durable-test-worker", env=None
        ) -> harness.Process:
            process = harness.worker(db_url, *args, app_name=app_name, env=env)
            self.started.append(process)
            return process

    bag = Bag()
    yield bag
    for process in bag.started:
        process.stop()
        # Shown by pytest only when the test failed.
        print(f"--- output of {process.app_name} (pid {process.pid}) ---\n{process.output()}")
