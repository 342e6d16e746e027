"""Find the code examples of the project's reStructuredText documents.

Every ``.. code-block:: python`` is an example that runs, and so is a ``::`` literal block
whose text compiles as Python (shell lines do not). An rst comment on the line before the
block (blank lines aside) changes how it is treated::

    .. example: settings      exec it alone, as a settings.py fragment, and check the
                              DURABLE_JOBS it defines with durable_jobs.conf.load()
    .. example: skip-shell    never run it (shell or other text that happens to compile)

A page whose examples use what another page defines (a how-to page that starts the handler
of the page before it) names that page in a comment of its own; its examples then run
after that page's, in the same namespace::

    .. example-prelude: docs/howto/handlers.rst
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("run", "settings", "skip-shell")

_CODE_BLOCK = re.compile(
    r"^(?P<indent>\s*)\.\. (?:code-block|code|sourcecode)::\s*(?P<lang>\S*)\s*$"
)
_MARKER = re.compile(r"^\s*\.\. example:\s*(?P<mode>\S+)\s*$")
_OPTION = re.compile(r"^\s+:[\w-]+:")
_PRELUDE = re.compile(r"^\.\. example-prelude:\s*(?P<path>\S+)\s*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Example:
    path: str  # relative to the repository root
    line: int  # 1-based line of the first line of code
    code: str
    mode: str  # one of MODES
    directive: bool  # a code-block (True) or a :: literal block (False)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def documents() -> list[Path]:
    """README.rst and every .rst under docs/ (not the build output)."""
    docs = sorted(
        p for p in (ROOT / "docs").rglob("*.rst") if "_build" not in p.relative_to(ROOT).parts
    )
    return [ROOT / "README.rst", *docs]


def preludes(path: Path) -> list[Path]:
    """The documents whose examples run before those of ``path`` (``.. example-prelude:``)."""
    found = [ROOT / m.group("path") for m in _PRELUDE.finditer(path.read_text(encoding="utf-8"))]
    for prelude in found:
        if not prelude.is_file():
            raise ValueError(f"{path.relative_to(ROOT)}: example-prelude {prelude} does not exist")
    return found


def extract(path: Path) -> list[Example]:
    """Return the Python examples of one document, in document order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = str(path.relative_to(ROOT))
    found: list[Example] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _CODE_BLOCK.match(line)
        literal = (
            not directive and line.rstrip().endswith("::") and not line.lstrip().startswith("..")
        )
        if not (directive or literal):
            i += 1
            continue
        base = len(line) - len(line.lstrip())
        if literal:  # a paragraph's indentation is that of its first line
            first = i
            while first > 0 and lines[first - 1].strip():
                first -= 1
            base = len(lines[first]) - len(lines[first].lstrip())
            mode = _marker(lines, first, rel)
        else:
            mode = _marker(lines, i, rel)
        j = i + 1
        while directive and j < len(lines) and _OPTION.match(lines[j]):
            j += 1
        body_start = j
        while j < len(lines) and (
            not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base
        ):
            j += 1
        body = lines[body_start:j]
        while body and not body[0].strip():
            body.pop(0)
            body_start += 1
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        if directive and directive.group("lang") in ("python", "python3", "py"):
            found.append(Example(rel, body_start + 1, code, mode, True))
        elif literal and body and (mode != "run" or _compiles(code)):
            found.append(Example(rel, body_start + 1, code, mode, False))
        i = max(j, i + 1)
    return found


def _marker(lines: list[str], index: int, rel: str) -> str:
    """The ``.. example: MODE`` comment right before line ``index``, or "run"."""
    k = index - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    match = _MARKER.match(lines[k]) if k >= 0 else None
    if match is None:
        return "run"
    mode = match.group("mode")
    if mode not in MODES:
        raise ValueError(f"{rel}:{k + 1}: unknown example marker {mode!r}; use one of {MODES}")
    return mode


def _compiles(code: str) -> bool:
    try:
        compile(code, "<literal block>", "exec")
    except SyntaxError:
        return False
    return True
