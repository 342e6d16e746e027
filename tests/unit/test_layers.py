"""The architecture is executable: every module sits in a layer, and no import runs in a circle.

``lint-imports`` (in .ci/run) checks the layers contract in pyproject.toml; a module the
contract does not name would be free to import anything, so this test makes sure each
module of the package is covered, and that the package has no import circle at all,
type-only imports aside.
"""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli there
    import tomli as tomllib

import grimp

import durable_jobs

ROOT = Path(durable_jobs.__file__).resolve().parent.parent


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    names = []
    for layer in contract["layers"]:
        names.extend(part.strip() for part in layer.replace(":", "|").split("|"))
    return names


def _covered(module: str, layers: list[str]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def test_every_module_of_the_package_is_in_a_layer():
    graph = grimp.build_graph("durable_jobs", exclude_type_checking_imports=True)
    layers = _layers()
    # Packages' own __init__ modules are containers; migrations only describe the schema.
    packages = {
        "durable_jobs",
        "durable_jobs.waits",
        "durable_jobs.schedules",
        "durable_jobs.workflows",
        "durable_jobs.limits",
    }
    loose = sorted(
        module
        for module in graph.modules
        if module not in packages
        and not module.startswith("durable_jobs.migrations")
        and not _covered(module, layers)
    )
    assert not loose, f"modules in no layer of pyproject.toml's import-linter contract: {loose}"


def test_the_package_has_no_import_circle():
    graph = grimp.build_graph("durable_jobs", exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    circles = []
    for start in modules:
        # A circle through `start`: something it imports leads back to it.
        seen, stack = set(), list(edges[start])
        while stack:
            module = stack.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                stack.extend(edges[module])
    assert not circles, f"modules on an import circle: {circles}"
