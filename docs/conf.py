"""Sphinx configuration of the durable_jobs documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (warnings are errors).
Autodoc imports the package, so Django is configured here with a minimal, database-less
setup: nothing in the build connects to PostgreSQL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

if not settings.configured:
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "durable_jobs"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "docs"}},
        USE_TZ=True,
    )
    django.setup()

project = "durable_jobs"
author = "the durable_jobs developers"
copyright = "the durable_jobs developers"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "settings_reference",
]

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Show defaults as written (the UNSET marker, not "<object object at 0x…>").
autodoc_preserve_defaults = True
# The public API is re-exported by durable_jobs/__init__.py; show it under that name.
add_module_names = True
