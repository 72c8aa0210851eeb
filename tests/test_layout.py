"""The package's layout: a core app and contrib apps, imports running from contrib to the
core only, contrib reaching the core through its public modules (or an entry of
:data:`INTERNALS` with its reason), migrations that import nothing of the package, and a
``docs/api.md`` that documents the declared public modules and nothing else.

The scan reads every import form: top level, inside functions, under ``if
TYPE_CHECKING``, relative ones, and dotted paths given to ``import_string`` or
``import_module``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_distlock"
CONTRIB = "django_distlock.contrib"

#: The declared public API: what docs/api.md documents and users import. Everything
#: else may move without a shim (CONTRIBUTING.md, "The layout").
PUBLIC = (
    "django_distlock",
    "django_distlock.backends.base",
    "django_distlock.backends.cache",
    "django_distlock.backends.database",
    "django_distlock.backends.locmem",
    "django_distlock.backends.redis",
    "django_distlock.backends.zookeeper",
    "django_distlock.caching",
    "django_distlock.exceptions",
    "django_distlock.health",
    "django_distlock.housekeeping",
    "django_distlock.http",
    "django_distlock.integrations.opentelemetry",
    "django_distlock.leadership",
    "django_distlock.ordering",
    "django_distlock.signals",
    "django_distlock.singleton",
    "django_distlock.testing",
    "django_distlock.testing.contract",
    "django_distlock.testing.history",
    "django_distlock.contrib.audit",
    "django_distlock.contrib.celery",
    "django_distlock.contrib.celery.once",
    "django_distlock.contrib.celery.testing",
    "django_distlock.contrib.debug_toolbar",
    "django_distlock.contrib.health_check",
    "django_distlock.contrib.optimistic",
    "django_distlock.contrib.optimistic.admin",
    "django_distlock.contrib.optimistic.fencing",
    "django_distlock.contrib.prometheus",
    "django_distlock.contrib.schedules",
)

#: Core modules that are not public but that contrib may import, each with why: the
#: core's services that a contrib app builds on and that users need not see.
INTERNALS = {
    "django_distlock.backends.database.errors": "a retry tells a transaction the database "
    "refused (deadlock, serialization failure) as the database backend does",
    "django_distlock.backends.shared_reads": "the listings name the holders of shared kinds",
    "django_distlock.backoff": "QueueOnce's and the jobs' waits back off as the core's do",
    "django_distlock.context": "a job's holder context is the decorator's",
    "django_distlock.decorators": "QueueOnce renders its key templates as @distlock does",
    "django_distlock.handle": "fenced writes, QueueOnce and the audit read a handle's Hold",
    "django_distlock.hold": "the audit keys a hold's events by its Hold",
    "django_distlock.handler": "checks read DISTLOCK through the registry's parser",
    "django_distlock.models": "the admin's entry is a proxy of the lock table",
    "django_distlock.names": "names are checked as the core checks them",
    "django_distlock.values": "validators and values shared with the core",
}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imported(module: str, path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, module) of every module ``module``'s source imports, names resolved."""
    tree = ast.parse(path.read_text() if source is None else source)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # "from pkg import module" imports the module
                below = f"{target}.{alias.name}"
                yield node.lineno, below if _is_module(below) else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"import_string", "import_module", "__import__"} and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield node.lineno, first.value


def core_to_contrib(module: str, path: Path, source: str | None = None) -> list[str]:
    if module.startswith(CONTRIB):
        return []
    return [
        f"{module}:{line} imports {target}"
        for line, target in imported(module, path, source)
        if target == CONTRIB or target.startswith(CONTRIB + ".")
    ]




def contrib_to_internals(module: str, path: Path, source: str | None = None) -> list[str]:
    if not module.startswith(CONTRIB):
        return []
    app = ".".join(module.split(".")[:3])
    wrong = []
    for line, target in imported(module, path, source):
        if not target.startswith("django_distlock") or target.startswith(app):
            continue
        if target.startswith(CONTRIB + "."):
            wrong.append(f"{module}:{line} imports another contrib app: {target}")
            continue
        if target not in PUBLIC and target not in INTERNALS:
            wrong.append(f"{module}:{line} imports {target}, neither public nor in INTERNALS")
    return wrong


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# -- import circles: none in the core but pairs that are one concept ----------------

#: Core modules that import each other (for types) because they are one concept, and why.
CORE_PAIRS = {
    frozenset({"django_distlock.hold", "django_distlock.holders"}):
        "the registry of who holds what keeps Holds, which register and leave it",
    frozenset({"django_distlock.hold", "django_distlock.renewal"}):
        "a Hold starts its renewal; the watchdog renews a Hold",
    frozenset({"django_distlock.hold", "django_distlock.backends.acquisition"}):
        "an Acquisition is of a Hold; a Hold keeps the Acquisition it holds by",
    frozenset({"django_distlock.ordering", "django_distlock.holders"}):
        "the lock-order checker reads who holds what from the holders' registry, which "
        "a Hold's acquire asks it about",
}
#: The largest import circle inside each backend package: a ratchet (they are the
#: backend's own modules, a backend class beside its acquisitions); never to grow.
BACKEND_CIRCLES = {"redis": 6, "database": 5, "zookeeper": 3, "cache": 2}


def import_graph() -> dict[str, set[str]]:
    """Each package module -> the package modules it imports (every form, types too)."""
    paths = dict(modules())
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for _, target in imported(module, path):
            while target and target not in graph:  # a name imported from a module
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]], pairs: set[frozenset[str]]) -> list[list[str]]:
    """The import circles (strongly connected sets of 2+ modules) left once the edges
    of the declared ``pairs`` are set aside, each sorted, largest first."""
    edges = {m: {t for t in ts if frozenset({m, t}) not in pairs} for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found, key=len, reverse=True)


def test_the_core_has_no_import_circle_but_its_declared_pairs() -> None:
    """Type-only imports included: the handle layer names its backend through a
    Protocol (``hold.LockBackend``), not the backends' base class that builds it."""
    graph = import_graph()
    left = circles(graph, set(CORE_PAIRS))
    core = [group for group in left if not group[0].startswith("django_distlock.backends.")
            or any(m.count(".") < 3 for m in group)]
    assert core == []
    paired = set().union(*CORE_PAIRS)
    whole = [group for group in circles(graph, set()) if set(group) & paired]
    assert len(whole) == 1 and set(whole[0]) <= paired, whole  # the pairs meet at hold
    for group in left:
        package = group[0].split(".")[2]
        assert {m.split(".")[2] for m in group} == {package}, group
        assert len(group) <= BACKEND_CIRCLES[package], (package, group)


def test_the_circle_check_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}}
    assert circles(graph, set()) == [["a", "b", "c"], ["d", "e"]]
    assert circles(graph, {frozenset({"d", "e"})}) == [["a", "b", "c"]]
    assert circles(graph, {frozenset({"a", "b"})}) == [["d", "e"]]
    # ... which is why a circle of the whole graph may hold only the pairs' modules:
    assert circles(graph, set())[0] == ["a", "b", "c"]


def test_the_core_imports_no_contrib_app() -> None:
    found = [line for module, path in modules() for line in core_to_contrib(module, path)]
    assert found == []


def test_contrib_reaches_the_core_through_public_modules_or_a_named_internal() -> None:
    found = [line for module, path in modules() for line in contrib_to_internals(module, path)]
    assert found == []


def test_every_internal_named_is_used_and_exists() -> None:
    used = {
        target
        for module, path in modules()
        if module.startswith(CONTRIB)
        for _, target in imported(module, path)
    }
    assert set(INTERNALS) <= used, f"INTERNALS not imported by contrib: {set(INTERNALS) - used}"


@pytest.mark.parametrize("source, expected", [
    ("from django_distlock.contrib.audit import recorder", True),
    ("def f():\n    from ..contrib.admin import views\n", True),
    ("if TYPE_CHECKING:\n    from ..contrib import celery\n", True),
    ("import_string('django_distlock.contrib.audit.recorder.follow_audit')", True),
    ("from django_distlock import handler", False),
])
def test_the_core_check_can_fail(source: str, expected: bool) -> None:
    path = PACKAGE / "backends" / "base.py"
    assert bool(core_to_contrib("django_distlock.backends.base", path, source)) is expected


@pytest.mark.parametrize("source, expected", [
    ("from django_distlock.backends.redis.scripts import ACQUIRE", True),
    ("from django_distlock.contrib.audit.recorder import write_event", True),
    ("from django_distlock.exceptions import LockLost", False),
    ("from django_distlock import signals", False),
    ("from django_distlock.values import LockInfo", False),
    ("from .operations import listing", False),
])
def test_the_contrib_check_can_fail(source: str, expected: bool) -> None:
    path = PACKAGE / "contrib" / "admin" / "views.py"
    found = contrib_to_internals("django_distlock.contrib.admin.views", path, source)
    assert bool(found) is expected, found


def test_no_migration_imports_the_package() -> None:
    found = [
        f"{module}:{line} imports {target}"
        for module, path in modules()
        if ".migrations." in module
        for line, target in imported(module, path)
        if target.startswith("django_distlock")
    ]
    assert found == []


def test_every_public_module_declares_its_names() -> None:
    for name in PUBLIC:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert missing == [], f"{name}.__all__ names what it lacks: {missing}"


def test_docs_api_documents_the_public_modules() -> None:
    documented = re.findall(r"^\.\. automodule:: ([\w.]+)$", (ROOT / "docs/api.md").read_text(),
                            re.MULTILINE)
    assert len(documented) == len(set(documented)), "a module documented twice"
    assert sorted(documented) == sorted(PUBLIC)
