"""Every Python example of README.rst and docs/ runs, against the real test database.

The examples of one document run in order in one namespace, so a later example uses what
an earlier one defined (the handler, then the start, then the watch); a page that names an
``example-prelude`` runs after that page's examples. They use a few names
that stand for the reader's own code; ``stand_ins()`` provides them. Handlers an example
registers are unregistered afterwards; jobs an example starts are run to their end with
``durable_jobs.testing`` (and one reconciler pass, which ends cancelled pending jobs), and
each must end ``completed`` -- or ``cancelled`` when an example asked for that. A test
function an example defines (``def test_…(db)``) is called.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FunctionType, ModuleType, SimpleNamespace

import pytest
from django.test import override_settings

import durable_jobs as durable
from durable_jobs import conf, registry, testing
from durable_jobs.models import Job
from durable_jobs.runtime.reconciler import Reconciler
from durable_jobs.schedules import declare
from testproject.demo.models import Effect, Report
from tests.docs.examples import ROOT, Example, documents, extract, preludes

pytestmark = pytest.mark.django_db

#: The rows the stand-in source yields: 7 rows in batches of 3 (so 3 batches, the last short).
SOURCE_ROWS = tuple(range(1, 8))
BATCH_SIZE = 3
#: Effect rows written by the stand-in ``write_rows`` carry this id.
EFFECTS = uuid.UUID("00000000-0000-0000-0000-00000000d0c5")


@dataclasses.dataclass(frozen=True)
class Batch:
    rows: tuple[int, ...]
    last: int  # the cursor after this batch
    end: int  # rows up to and including this batch (used by earlier versions of the example)
    total: int


def source_batches(after: int) -> Iterator[Batch]:
    """The README's ``source_batches``: the source rows after ``after``, a batch at a time."""
    rows = [row for row in SOURCE_ROWS if row > after]
    for start in range(0, len(rows), BATCH_SIZE):
        chunk = tuple(rows[start : start + BATCH_SIZE])
        yield Batch(
            rows=chunk, last=chunk[-1], end=SOURCE_ROWS.index(chunk[-1]) + 1, total=len(SOURCE_ROWS)
        )


def write_rows(batch: Batch) -> None:
    """The README's ``write_rows``: one domain row per source row, in the caller's transaction."""
    Effect.objects.bulk_create(Effect(job_id=EFFECTS, item=row, epoch=0) for row in batch.rows)


def stand_ins() -> dict:
    """The names the examples take from the reader's project (a model, their code, a view's locals).

    The namespace is the ``__dict__`` of a module registered as ``docs_examples``, so a
    ``@task`` an example defines has a module path the in-process worker can import.
    """
    module = ModuleType("docs_examples")
    sys.modules["docs_examples"] = module
    module.__dict__.update(
        {
            "Report": Report,
            # The tutorial's import: its model, its feed and its writes.
            "Import": Report,
            "feed_batches": source_batches,
            "save_products": write_rows,
            "source_batches": source_batches,
            "write_rows": write_rows,
            "request_id": "request-7f3a",
            "user": SimpleNamespace(pk=42),
            "report_ids": [Report.objects.create(name=f"batch {n}").pk for n in range(3)],
        }
    )
    return module.__dict__


FIXTURES = {"db": None}  # what an example's own test function may ask for

#: What a completed job of each kind the examples start must hold: (result, checkpoint).
#: A kind missing here fails the test: say what its example is expected to produce.
EXPECTED = {
    "reports.rebuild": (
        {"rows": len(SOURCE_ROWS)},
        {"cursor": SOURCE_ROWS[-1], "rows": len(SOURCE_ROWS)},
    ),
    "catalog.import": (  # the tutorial's import job
        {"rows": len(SOURCE_ROWS)},
        {"cursor": SOURCE_ROWS[-1], "rows": len(SOURCE_ROWS)},
    ),
    # docs/howto/schedules.rst: a scheduled kind that does nothing but finish.
    "reports.daily": (None, None),
    # docs/unique.rst: handlers that return DONE
    "search.refresh": (None, None),
    "billing.sync_customer": (None, None),
    # docs/howto/flow-control.rst: handlers that return DONE
    "billing.sync": (None, None),
    "mail.send": (None, None),
    "reports.build": (None, None),
    # docs/transports.rst: a handler that returns DONE
    "imports.thumbnail": (None, None),
    # Django's Tasks framework: every task is a job of kind django.tasks; keyed by task.
    "docs_examples.send_welcome": ({"sent_to": 42}, None),
    # docs/workflows.rst: five rows in chunks of two, a summary, an approval webhook; a
    # kind whose jobs end differently lists every (result, checkpoint) it may end with.
    "imports.chunk": [({"imported": 2}, None), ({"imported": 1}, None)],
    "imports.file": (
        {"imported": 5, "failed_chunks": [], "published": True, "by": "ops@example.com"},
        {"spawned": 3, "summary": {"imported": 5, "failed_chunks": []}},
    ),
    "reminders.nudge": (None, {"slept": True}),
    # docs/workflows.rst: a summary started after three extracts reads their results.
    "reports.extract": ({"rows": 7}, None),
    "reports.summary": ({"rows": 21}, None),
}


def expected_key(job: Job) -> str:
    """A job's key in EXPECTED: its kind, or for a task job the task's module path."""
    if job.kind == "django.tasks" and isinstance(job.input, dict):
        return job.input.get("task") or job.kind
    return job.kind


def run_examples(examples: list[Example], namespace: dict) -> None:
    """Run each example in ``namespace``; settings fragments alone; call the tests they define."""
    for example in examples:
        if example.mode == "skip-shell":
            continue
        if example.mode == "settings":
            check_settings_fragment(example)
            continue
        before = set(namespace)
        exec(compile(example.code, example.where, "exec"), namespace)
        for name in sorted(set(namespace) - before):
            if name.startswith("test_") and isinstance(namespace[name], FunctionType):
                call_example_test(example, namespace[name])


def check_settings_fragment(example: Example) -> None:
    fragment: dict = {}
    exec(compile(example.code, example.where, "exec"), fragment)
    if "DURABLE_JOBS" in fragment:
        # LISTEN_DATABASE names an alias of the fragment's own DATABASES, when it has some.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Django warns that overriding DATABASES is unusual
            with override_settings(**{k: fragment[k] for k in ("DATABASES",) if k in fragment}):
                conf.load(
                    fragment["DURABLE_JOBS"]
                )  # raises ConfigurationError naming what is wrong
    if "INSTALLED_APPS" in fragment:
        assert "durable_jobs" in fragment["INSTALLED_APPS"], example.where
    assert {"DURABLE_JOBS", "INSTALLED_APPS"} & set(fragment), (
        f"{example.where}: a settings example sets nothing"
    )


def call_example_test(example: Example, func: FunctionType) -> None:
    names = func.__code__.co_varnames[: func.__code__.co_argcount]
    missing = [name for name in names if name not in FIXTURES]
    assert not missing, (
        f"{example.where}: {func.__name__} asks for fixtures this runner lacks: {missing}"
    )
    func(**{name: FIXTURES[name] for name in names})


@pytest.fixture(autouse=True)
def wait_profiles(settings, tmp_path):
    """Declare the check the wait examples name: a real script that always says go."""
    script = tmp_path / "ticket_closed.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "WAIT_PROFILES": f"ticket-closed:{script}"}


@pytest.fixture
def registered_kinds():
    """Forget every handler and schedule an example registers."""
    before = set(registry.kinds())
    schedules = list(declare._declared)
    yield
    for kind in set(registry.kinds()) - before:
        registry.unregister(kind)
    declare._declared[:] = schedules  # and every schedule one declares


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("document", documents(), ids=_ids)
def test_examples__run_and_every_job_they_start_ends_as_asked(document, registered_kinds):
    examples = [e for prelude in preludes(document) for e in extract(prelude)]
    examples += extract(document)
    existing = set(Job.objects.values_list("id", flat=True))

    run_examples(examples, stand_ins())

    testing.run_jobs(fast_forward=True)
    Reconciler().run_pass()  # ends the pending jobs an example asked to cancel
    started = list(Job.objects.exclude(id__in=existing))
    if any("durable.start" in example.code for example in examples):
        assert started, f"{_ids(document)}: its examples start jobs, yet none was found"
    for job in started:
        expected = "cancelled" if job.cancel_requested_at else "completed"
        assert job.status == expected, (
            f"{_ids(document)}: a {job.kind} job ended {job.status} "
            f"({job.error_code}: {job.error_message}), expected {expected}"
        )
        if job.status == "completed":
            key = expected_key(job)
            assert key in EXPECTED, (
                f"{_ids(document)}: add what a {key} job should produce to EXPECTED"
            )
            allowed = EXPECTED[key] if isinstance(EXPECTED[key], list) else [EXPECTED[key]]
            assert (job.result, job.checkpoint) in allowed, _ids(document)


def readme_example(containing: str) -> Example:
    matches = [e for e in extract(ROOT / "README.rst") if containing in e.code]
    assert len(matches) == 1, (
        f"expected one README example containing {containing!r}, found {len(matches)}"
    )
    return matches[0]


def test_readme_handler__completes_when_a_slice_starts_with_nothing_left_to_do(
    settings, registered_kinds
):
    # A tiny slice budget makes every slice yield right after its first batch, so the
    # slice after the last batch starts with nothing left to do -- as a resumed job whose
    # last checkpoint covered everything does.
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "SLICE_BUDGET": 0.001}
    run_examples([readme_example('@durable.handler("reports.rebuild"')], stand_ins())
    report = Report.objects.create(name="resume")
    job = durable.start("reports.rebuild", input={"report": report.pk}, subject=report)

    outcomes = [slice_.outcome for slice_ in testing.run_jobs(fast_forward=True)]

    assert outcomes == ["yielded", "yielded", "yielded", "completed"]
    row = durable.get(job.id)
    assert (row.status, row.error_code) == ("completed", None)
    assert row.result == {"rows": 7}
    assert row.checkpoint == {"cursor": 7, "rows": 7}
    assert sorted(Effect.objects.filter(job_id=EFFECTS).values_list("item", flat=True)) == list(
        SOURCE_ROWS
    )
    report.refresh_from_db()
    assert report.status == "completed"


def test_readme_handler__completes_in_one_slice_with_the_default_budget(registered_kinds):
    run_examples([readme_example('@durable.handler("reports.rebuild"')], stand_ins())
    job = durable.start("reports.rebuild", input={"report": 1})

    assert [s.outcome for s in testing.run_jobs()] == ["completed"]
    assert durable.get(job.id).result == {"rows": 7}


def tutorial_examples(*containing: str) -> list[Example]:
    found = []
    for needle in containing:
        matches = [e for e in extract(ROOT / "docs" / "tutorial.rst") if needle in e.code]
        assert len(matches) == 1, f"expected one tutorial example containing {needle!r}"
        found += matches
    return found


def test_tutorial_import__resumes_slice_after_slice_and_writes_each_row_once(
    settings, registered_kinds
):
    # The tutorial's last handler (step 5) started by its start_import() (step 6), with a
    # slice budget so small that every slice yields after one batch.
    settings.DURABLE_JOBS = {**settings.DURABLE_JOBS, "SLICE_BUDGET": 0.001}
    namespace = {**stand_ins(), "durable": durable}  # step 1 imports it
    run_examples(tutorial_examples("mirror=mirror", "def start_import"), namespace)
    job = namespace["job"]

    outcomes = [slice_.outcome for slice_ in testing.run_jobs(fast_forward=True)]

    assert outcomes == ["yielded", "yielded", "yielded", "completed"]
    row = durable.get(job.id)
    assert (row.status, row.result) == ("completed", {"rows": 7})
    assert sorted(Effect.objects.filter(job_id=EFFECTS).values_list("item", flat=True)) == list(
        SOURCE_ROWS
    )
    feed = Report.objects.get(pk=row.subject_id)
    assert (feed.status, feed.rows_written) == ("completed", 7)


def test_extractor__finds_every_python_code_block():
    for document in documents():
        text = document.read_text(encoding="utf-8")
        declared = len(re.findall(r"^\s*\.\. code-block:: python\s*$", text, flags=re.MULTILINE))
        found = [e for e in extract(document) if e.directive]
        assert len(found) == declared, _ids(document)


def test_extractor__tells_python_literal_blocks_from_shell_and_honours_markers(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("tests.docs.examples.ROOT", tmp_path)
    doc = tmp_path / "x.rst"
    doc.write_text(
        "Shell::\n\n    python manage.py migrate\n\n"
        "Python::\n\n    import durable_jobs\n\n"
        ".. example: skip-shell\n\n::\n\n    ls\n\n"
        ".. example: settings\n\n.. code-block:: python\n   :caption: settings.py\n\n    DURABLE_JOBS = {}\n",
        encoding="utf-8",
    )
    assert [(e.line, e.mode, e.code) for e in extract(doc)] == [
        (7, "run", "import durable_jobs\n"),
        (13, "skip-shell", "ls\n"),
        (20, "settings", "DURABLE_JOBS = {}\n"),
    ]


def test_examples__a_raising_example_fails_its_document(registered_kinds):
    example = Example(
        "README.rst", 1, "durable.get('00000000-0000-0000-0000-000000000000')\n", "run", True
    )
    with pytest.raises(durable.JobNotFound):
        run_examples([example], {"durable": durable})


_TEST_REFERENCE = re.compile(r"``(tests/[\w/]+\.py)::([\w:]+)``")


def test_docs__name_only_tests_that_exist():
    referenced = 0
    for document in documents():
        for path, name in _TEST_REFERENCE.findall(document.read_text(encoding="utf-8")):
            referenced += 1
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            *classes, function = name.split("::")
            scope = tree.body
            for cls in classes:
                scope = next(
                    (n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), []
                )
            assert any(isinstance(n, ast.FunctionDef) and n.name == function for n in scope), (
                f"{_ids(document)} names {path}::{name}, which does not exist"
            )
    assert referenced > 30  # the invariants page links its tests
