"""Job ids are time-ordered UUIDs (version 7): unique, and in creation order within a process."""

from __future__ import annotations

import threading
import time
import uuid

from durable_jobs.ids import uuid7


def test_ids_are_version_7_rfc_variant_and_carry_the_creation_millisecond():
    before = time.time_ns() // 1_000_000
    made = uuid7()
    after = time.time_ns() // 1_000_000
    assert made.version == 7
    assert made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after + 1


def test_ids_made_in_one_process_sort_in_creation_order_and_never_repeat():
    made = [uuid7() for _ in range(50_000)]  # many per millisecond
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_threads_never_get_the_same_id():
    results: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(into):
        into.extend(uuid7() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(r,)) for r in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for r in results for i in r]
    assert len(set(every)) == len(every)
