"""``.. durable-settings::``: the settings reference, generated from ``conf.Settings``.

Every field of the dataclass becomes an entry with its default and the ``#:`` comment
written above it in ``durable_jobs/conf.py``, so a setting added there appears here with no
edit to the docs. A field without a ``#:`` comment is a build warning (the build runs with
warnings as errors), so an undocumented setting cannot ship.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from docutils import nodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def describe_default(field: dataclasses.Field) -> str:
    """The default as a user would write it in ``DURABLE_JOBS``, durations made readable."""
    value = field.default
    if field.type in ("float", "float | None") and isinstance(value, float):
        seconds = int(value) if value.is_integer() else value
        if isinstance(seconds, int) and seconds >= 86400 and seconds % 86400 == 0:
            return f"``{seconds}`` ({timedelta(seconds=seconds).days} days)"
        return f"``{seconds}`` s"
    return f"``{value!r}``"


def describe_type(field: dataclasses.Field) -> str:
    from durable_jobs import conf

    choices = {"EXECUTION": conf.EXECUTION_MODES, "START_METHOD": conf.START_METHODS}
    if field.name in choices:
        return "one of " + ", ".join(f"``{choice!r}``" for choice in choices[field.name])
    kinds = {
        "float": "duration (seconds or ``timedelta``)",
        "float | None": "duration (seconds or ``timedelta``) or ``None``",
        "int": "positive integer",
        "int | None": "positive integer or ``None``",
        "bool": "``True`` / ``False``",
        "str": "name (1-100 of ``A-Z a-z 0-9 _ . : -``)",
    }
    return kinds.get(str(field.type), f"``{field.type}``")


class SettingsReference(SphinxDirective):
    """Render every ``conf.Settings`` field as a definition-list entry."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from durable_jobs import conf

        analyzer = ModuleAnalyzer.for_module("durable_jobs.conf")
        docs = analyzer.find_attr_docs()
        self.env.note_dependency(analyzer.srcname)
        entries = nodes.definition_list()
        for field in dataclasses.fields(conf.Settings):
            comment = " ".join(
                line.strip() for line in docs.get(("Settings", field.name), []) if line.strip()
            )
            if not comment:
                logger.warning(
                    "durable_jobs.conf.Settings.%s has no '#:' comment: document the setting "
                    "where it is defined",
                    field.name,
                    location=(self.env.docname, self.lineno),
                )
                comment = "(undocumented)"
            target = nodes.target("", "", ids=[f"setting-{field.name.lower().replace('_', '-')}"])
            term = nodes.term("", "", nodes.literal(field.name, field.name))
            facts = nodes.paragraph()
            facts += nodes.emphasis("Default: ", "Default: ")
            facts += self.inline(describe_default(field))
            facts += nodes.Text(" -- ")
            facts += nodes.emphasis("type: ", "type: ")
            facts += self.inline(describe_type(field))
            # The comment is shown as written: plain text, so no wording in conf.py can
            # break the build with an rst formatting warning.
            definition = nodes.definition("", facts, nodes.paragraph(comment, comment))
            entries += nodes.definition_list_item("", target, term, definition)
        return [entries]

    def inline(self, text: str) -> list[nodes.Node]:
        """Parse the short rst this module writes itself (double-backquoted literals)."""
        parsed, _messages = self.state.inline_text(text, self.lineno)
        return parsed


def setup(app):
    app.add_directive("durable-settings", SettingsReference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
