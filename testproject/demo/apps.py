import os

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "testproject.demo"
    label = "demo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("DEMO_RAISING_TASK_RECEIVERS"):
            # tests/tasks: receivers of Django's task signals that always raise, in a worker
            # and in its handler processes (they inherit the environment).
            from testproject.demo import tasks

            tasks.connect_raising_receivers()
