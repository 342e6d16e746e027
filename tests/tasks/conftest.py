from tests.acceptance.conftest import processes  # noqa: F401 - real worker processes for test_worker.py
