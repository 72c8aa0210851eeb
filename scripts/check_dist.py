#!/usr/bin/env python3
"""Check a built wheel and sdist against the source tree they were built from.

Standard library only (``scripts/release`` runs it with any python3 >= 3.11)::

    scripts/check_dist.py --source DIR dist/NAME-VERSION-py3-none-any.whl dist/NAME-VERSION.tar.gz

The wheel must hold the package and nothing else: its Python modules, ``py.typed``,
the SQL files under ``sql/``, the files under each app's ``templates/`` and ``static/``,
and its ``.dist-info``; every such file of the source tree, and no other (no tests/,
benchmarks/, testproject/ or docs/, no ``.pyc``, no hidden or backup file). The sdist
must hold what builds the wheel: ``PKG-INFO``, ``setup.cfg``, ``pyproject.toml``, the
README, the license files the source tree has, and the same package files; and no
other directory. Prints each offending entry and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import configparser
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

# Files under templates/ and static/ that a site serves or renders.
TEMPLATE_SUFFIXES = {".html", ".txt", ".xml", ".json", ".js", ".css", ".svg"}
STATIC_SUFFIXES = {
    ".js", ".mjs", ".css", ".map", ".json", ".svg", ".png", ".jpg", ".jpeg", ".gif",
    ".webp", ".ico", ".woff", ".woff2", ".ttf",
}
# What setuptools' default license_files globs pick up (and puts in .dist-info/licenses/).
LICENSE_GLOBS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")
# Top-level files of the sdist besides the package and its .egg-info.
SDIST_REQUIRED = ("PKG-INFO", "setup.cfg", "pyproject.toml")
SDIST_OPTIONAL = ("setup.py", "MANIFEST.in")
DIST_INFO_FILES = {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt"}


def why_not_shipped(path: PurePosixPath) -> str | None:
    """Return why ``path`` (relative to the package directory) does not belong in the
    wheel, or None when it does."""
    parts = path.parts
    if any(part.startswith(".") for part in parts):
        return "hidden file"
    if "__pycache__" in parts or path.suffix in {".pyc", ".pyo"}:
        return "compiled Python"
    if path.name.endswith(("~", ".orig", ".rej", ".bak", ".swp")):
        return "backup or patch file"
    if any(part in {"tests", "test"} for part in parts[:-1]):
        return "a tests directory inside the package"
    if "templates" in parts[:-1]:
        return None if path.suffix in TEMPLATE_SUFFIXES else "not a template"
    if "static" in parts[:-1]:
        return None if path.suffix in STATIC_SUFFIXES else "not a static asset"
    if parts[0] == "sql":
        return None if path.suffix == ".sql" and len(parts) == 2 else "not an SQL file"
    if path.suffix == ".py":
        return None
    if path == PurePosixPath("py.typed"):
        return None
    return "not a module, py.typed, SQL file, template or static file"


def source_package_files(source: Path, package: str) -> tuple[set[str], set[str]]:
    """Return the package's files in the source tree that the wheel must ship, and
    those it must not (both as paths relative to ``source``)."""
    shipped: set[str] = set()
    left_out: set[str] = set()
    root = source / package
    for path in root.rglob("*"):
        if path.is_file():
            relative = PurePosixPath(path.relative_to(root).as_posix())
            name = f"{package}/{relative}"
            reason = why_not_shipped(relative)
            if reason is None:
                shipped.add(name)
            elif reason != "compiled Python":  # a byproduct of running it, not a source
                left_out.add(name)
    return shipped, left_out


def license_files(source: Path) -> set[str]:
    """Return the license files at the top of the source tree."""
    return {path.name for glob in LICENSE_GLOBS for path in source.glob(glob) if path.is_file()}


def check_package_files(
    kind: str, names: Iterable[str], package: str, expected: set[str]
) -> list[str]:
    """Return the problems of the package's files ``names`` in a ``kind`` archive."""
    problems = []
    names = set(names)
    for name in sorted(names):
        reason = why_not_shipped(PurePosixPath(name).relative_to(package))
        if reason:
            problems.append(f"{kind}: {name}: {reason}")
        elif name not in expected:
            problems.append(f"{kind}: {name}: not in the source tree")
    problems += [f"{kind}: {name}: missing" for name in sorted(expected - names)]
    return problems


def check_wheel(path: Path, package: str, expected: set[str], licenses: set[str]) -> list[str]:
    """Return the problems of the wheel at ``path``."""
    with zipfile.ZipFile(path) as archive:
        names = [name for name in archive.namelist() if not name.endswith("/")]
    dist_info = path.name.split("-")[0] + "-" + path.name.split("-")[1] + ".dist-info"
    problems = []
    in_package = [name for name in names if name.startswith(f"{package}/")]
    for name in names:
        if name.startswith(f"{package}/"):
            continue
        if name.startswith(f"{dist_info}/"):
            inner = name.removeprefix(f"{dist_info}/")
            if inner in DIST_INFO_FILES or inner.removeprefix("licenses/") in licenses:
                continue
        problems.append(f"wheel: {name}: outside the package")
    problems += check_package_files("wheel", in_package, package, expected)
    present = {name.removeprefix(f"{dist_info}/licenses/") for name in names}
    problems += [
        f"wheel: {dist_info}/licenses/{name}: missing" for name in sorted(licenses - present)
    ]
    return problems


def metadata(source: Path, key: str) -> str:
    """Return the ``[metadata]`` value ``key`` of the source tree's setup.cfg, or ""."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(source / "setup.cfg")
    return config.get("metadata", key, fallback="").strip()


def readme_name(source: Path) -> str | None:
    """Return the file that setup.cfg's ``long_description = file: ...`` names, if any."""
    value = metadata(source, "long_description")
    if not value.startswith("file:"):
        return None
    return value.removeprefix("file:").strip() or None


def check_sdist(
    path: Path, source: Path, package: str, expected: set[str], licenses: set[str]
) -> list[str]:
    """Return the problems of the sdist at ``path``."""
    top = path.name.removesuffix(".tar.gz")
    with tarfile.open(path) as archive:
        names = [member.name for member in archive.getmembers() if not member.isdir()]
    problems = []
    relative: set[str] = set()
    for name in names:
        if not name.startswith(f"{top}/"):
            problems.append(f"sdist: {name}: outside {top}/")
        else:
            relative.add(name.removeprefix(f"{top}/"))
    readme = readme_name(source)
    required = {*SDIST_REQUIRED, *licenses, *([readme] if readme else [])}
    allowed_top = required | {name for name in SDIST_OPTIONAL if (source / name).is_file()}
    egg_info = f"{package}.egg-info/"
    in_package = {name for name in relative if name.startswith(f"{package}/")}
    for name in sorted(relative - in_package):
        if name not in allowed_top and not name.startswith(egg_info):
            problems.append(f"sdist: {top}/{name}: not needed to build the wheel")
    problems += [f"sdist: {top}/{name}: missing" for name in sorted(required - relative)]
    problems += check_package_files("sdist", in_package, package, expected)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the tree built from")
    parser.add_argument("--package", help="the import package (default: the wheel's name)")
    parser.add_argument("wheel", type=Path)
    parser.add_argument("sdist", type=Path)
    args = parser.parse_args(argv)
    package = args.package or args.wheel.name.split("-")[0]
    if not (args.source / package / "__init__.py").is_file():
        print(f"no package {package!r} in {args.source}")
        return 1
    expected, left_out = source_package_files(args.source, package)
    licenses = license_files(args.source)
    problems = check_wheel(args.wheel, package, expected, licenses)
    problems += check_sdist(args.sdist, args.source, package, expected, licenses)
    print(f"wheel and sdist: {len(expected)} package files expected")
    for name in sorted(left_out):
        print(f"  not shipped (by design): {name}")
    if not licenses:
        declared = metadata(args.source, "license")
        print(
            "  WARNING: no license file (LICENSE, COPYING, ...) in the source tree"
            + (f", although setup.cfg declares license = {declared}" if declared else "")
            + ": neither the wheel nor the sdist carries a license text"
        )
    for problem in problems:
        print(f"  {problem}")
    if problems:
        print(f"{len(problems)} problem(s) in the built files")
        return 1
    print("OK: the wheel holds the package only, the sdist what builds it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
