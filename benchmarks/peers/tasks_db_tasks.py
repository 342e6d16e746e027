"""The django-tasks-db peer's task (its own module, so the worker imports it by path)."""

from django_tasks import task


@task()
def noop() -> None:
    return None
