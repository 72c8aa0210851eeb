"""The docs name what the code has.

- docs/architecture.md, "Adding a backend": its two tables name every capability flag,
  declaration and hook a backend writes (read off ``BaseLockBackend``
  and ``Acquisition``), and nothing that is not one; its text names each
  class-level declaration of the package's own backends (``DatabaseBackend.modes``,
  ``for_vendor``...), and every ``Class.attribute`` it writes exists.
- docs/architecture.md, "Package layout": every module of the package is in the table.
- The handler API the docs show (``locks.<name>``) exists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import django_distlock
from django_distlock.backends.acquisition import Acquisition
from django_distlock.backends.base import FEATURE_HOOKS, BaseLockBackend
from django_distlock.handler import LockHandler
from django_distlock.kinds import KindFlag
from django_distlock.testing.contract import FLAGS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
PACKAGE = Path(django_distlock.__file__).resolve().parent


def section(title: str) -> str:
    """The text of the ``## `` section of docs/architecture.md whose title starts so,
    without its fenced code blocks (their backticks would pair with the inline ones)."""
    found = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", ARCHITECTURE.read_text(),
                      re.S | re.M)
    assert found, f"docs/architecture.md lost its section {title!r}"
    return re.sub(r"^ *```.*?^ *```", "", found.group(0), flags=re.S | re.M)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the Markdown tables in ``text`` (not their headers), as cells."""
    lines = text.splitlines()
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for i, line in enumerate(lines)
        if line.startswith("|") and not _rule(line)
        and not (i + 1 < len(lines) and _rule(lines[i + 1]))
    ]


def _rule(line: str) -> bool:
    """Whether ``line`` is a table's header rule (``| --- | --- |``)."""
    return re.fullmatch(r"\|( *:?-+:? *\|)+", line.strip()) is not None


def names_in(cell: str) -> set[str]:
    """The names a cell writes in code: `name`, `name()`, `name(args)`, `Class.name`."""
    return {
        match.group(1)
        for span in re.findall(r"`([^`]+)`", cell)
        if (match := re.fullmatch(r"(?:\w+\.)?(\w+)(?:\(.*\))?", span))
    }


# -- what a backend writes, read off the code ------------------------------------------


def _own_classes(cls: type) -> list[type]:
    return [klass for klass in cls.__mro__ if klass.__module__.startswith("django_distlock.")]


def _bodies(cls: type) -> dict[str, list[ast.stmt]]:
    """Each method defined in ``cls``'s own source: its body without the docstring."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    klass = tree.body[0]
    assert isinstance(klass, ast.ClassDef)
    bodies = {}
    for node in klass.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            bodies[node.name] = body
    return bodies


def _raises_not_implemented(body: list[ast.stmt]) -> bool:
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in (
        ast.unparse(body[0].exc) if body[0].exc else "")


def _does_nothing(body: list[ast.stmt]) -> bool:
    """``return None``, ``return []``, ``return False`` or ``pass``: a default a backend
    replaces to say more."""
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Pass):
        return True
    return isinstance(stmt, ast.Return) and (
        stmt.value is None or ast.unparse(stmt.value) in ("None", "[]", "False"))


def flags() -> set[str]:
    """The capability flags: the base's class attributes whose value is a bool, or is
    read from the kinds table (a KindFlag)."""
    return {
        name for klass in _own_classes(BaseLockBackend) for name, value in vars(klass).items()
        if isinstance(value, bool | KindFlag)
    }


def declarations() -> set[str]:
    """The base's other public class attributes with a value (not methods)."""
    return {
        name for klass in _own_classes(BaseLockBackend) for name, value in vars(klass).items()
        if not name.startswith("_") and not callable(value)
        and not isinstance(value, bool | KindFlag | property | classmethod | staticmethod)
    }


def feature_hooks() -> set[str]:
    """The hooks behind optional features: the base's methods whose body only raises
    NotImplementedError (never called: see ``BaseLockBackend._check_implementation``)."""
    return {
        name for klass in _own_classes(BaseLockBackend)
        for name, body in _bodies(klass).items() if _raises_not_implemented(body)
    }


def overridable(cls: type) -> set[str]:
    """What a subclass of ``cls`` writes or may replace: its abstract methods, the
    methods whose body does nothing in ``cls`` (a default to replace), and for
    ``Acquisition``, every public method (each has a default or is abstract)."""
    names = set(getattr(cls, "__abstractmethods__", ()))
    for klass in _own_classes(cls):
        for name, body in _bodies(klass).items():
            if _does_nothing(body) and not name.startswith("__"):
                names.add(name)
    if cls is Acquisition:
        names |= {name for name, value in vars(cls).items()
                  if callable(value) and not name.startswith("_")}
    return names


def backend_classes() -> list[type[BaseLockBackend]]:
    """The package's backend classes (every module of ``backends/`` imported)."""
    import django_distlock.backends as backends

    for module in pkgutil.walk_packages(backends.__path__, backends.__name__ + "."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # an extra not installed
            continue
    found, todo = [], [BaseLockBackend]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("django_distlock.backends."):
                found.append(sub)
    return found


# -- the tests ---------------------------------------------------------------------------


def test_the_definitions_find_what_the_base_declares() -> None:
    """The reading of the code above is not vacuous, and agrees with the base's own table
    of feature hooks and the contract's list of flags."""
    assert {"supports_fencing", "supports_listing", "supports_age_order", "distributed"} \
        <= flags()
    assert set(FLAGS) == flags(), "testing/contract/support.py's FLAGS lacks a flag"
    assert feature_hooks() == set(FEATURE_HOOKS.values()), (
        "a hook that raises NotImplementedError is not in base.FEATURE_HOOKS (or the reverse)")
    assert set(FEATURE_HOOKS) <= flags()
    assert {"kinds", "why_unsupported"} <= declarations()
    assert {"is_locked", "health", "check", "close", "check_fenced_write",
            "in_caller_transaction"} <= overridable(BaseLockBackend)
    assert {"attempt", "release", "extend", "close", "aattempt"} <= overridable(Acquisition)


def test_adding_a_backend_names_every_flag_hook_and_declaration() -> None:
    text = section("Adding a backend")
    named = set().union(*(names_in(row[0]) for row in table_rows(text)))
    wanted = (flags() | declarations() | feature_hooks() | {"acquisition"}
              | overridable(BaseLockBackend) | overridable(Acquisition))
    assert sorted(wanted - named) == [], "docs/architecture.md's tables lack these"
    exists = {name for name in named if hasattr(BaseLockBackend, name)
              or hasattr(Acquisition, name)}
    assert sorted(named - exists) == [], "docs/architecture.md names what no longer exists"


def test_every_flag_the_architecture_names_exists() -> None:
    named = set(re.findall(r"\bsupports_\w+", ARCHITECTURE.read_text()))
    assert sorted(named - flags()) == []


def test_the_backends_own_declarations_are_named() -> None:
    """Each class-level declaration of a backend of the package (an annotated class
    attribute, a classmethod, a ``__new__`` that picks the class from an option) is named
    in "Adding a backend", and each ``Class.attribute`` written there exists."""
    text = section("Adding a backend")
    classes = {cls.__name__: cls for cls in backend_classes()}
    assert {"DatabaseBackend", "RedisBackend", "LocMemBackend"} <= classes.keys()
    wanted = set()
    for name, cls in classes.items():
        own = set(inspect.get_annotations(cls)) | {
            attr for attr, value in vars(cls).items() if isinstance(value, classmethod)}
        wanted |= {f"{name}.{attr}" for attr in own}
        if "__new__" in vars(cls):
            wanted.add(f"{name}.__new__")
    assert wanted, "no backend declares anything of its own: the reading is stale"
    spans = set(re.findall(r"`([^`]+)`", text))
    written = {re.sub(r"\(.*\)$", "", span) for span in spans}
    assert sorted(wanted - written) == [], "docs/architecture.md does not name these"
    for span in written:
        match = re.fullmatch(r"(\w+Backend)\.(\w+)", span)
        if match and match.group(1) in classes:
            cls, attribute = classes[match.group(1)], match.group(2)
            assert hasattr(cls, attribute) or attribute in inspect.get_annotations(cls), span


def test_the_package_table_names_every_module() -> None:
    """Every module file of the package is in "Package layout": a row whose first cell is
    the file, or whose first cell is its directory and whose text names the file.
    Not required: ``migrations/*.py`` (the ``migrations/`` row stands for them) and the
    sub-packages' ``__init__.py`` (re-exports; the package's row stands for them); the
    top-level ``__init__.py`` (the public names) is."""
    covered: set[str] = set()
    directories: set[str] = set()
    for row in table_rows(section("Package layout")):
        paths = re.findall(r"`([\w/.]+)`", row[0])
        assert paths, f"a row of the package table names no path: {row}"
        folders = [path for path in paths if path.endswith("/")]
        covered |= {path for path in paths if path.endswith(".py")}
        directories |= set(folders)
        named = re.findall(r"`(\w+\.py)`", " | ".join(row[1:]))
        if folders and named:
            assert len(folders) == 1, f"modules named for one directory only: {row[0]}"
            covered |= {folders[0] + name for name in named}
    modules = {
        path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        and (path.name != "__init__.py" or path.parent == PACKAGE)
    }
    assert sorted(modules - covered) == [], "docs/architecture.md's package table lacks these"
    assert sorted(path for path in covered if not (PACKAGE / path).is_file()) == [], (
        "docs/architecture.md's package table names modules that do not exist")
    assert sorted(d for d in directories if not (PACKAGE / d).is_dir()) == []
    assert "migrations/" in directories


def test_every_locks_attribute_the_docs_name_exists() -> None:
    named = {
        (page.name, attribute)
        for page in sorted(DOCS.glob("*.md"))
        for code in re.findall(r"```.*?```|`[^`\n]+`", page.read_text(), re.S)
        for attribute in re.findall(r"(?<![\w.])locks\.([A-Za-z_]\w*)", code)
    }
    assert named, "no `locks.<name>` found in docs/: the pattern is stale"
    missing = sorted((page, name) for page, name in named if not hasattr(LockHandler, name))
    assert missing == [], f"docs name LockHandler attributes that do not exist: {missing}"
