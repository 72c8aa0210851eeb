"""``scripts/check_dist.py``, the content check of ``scripts/release``: on archives made
here from a small source tree, it passes the right ones and names each stray or
missing entry of the others."""

from __future__ import annotations

import importlib.util
import io
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_FILES = {
    "pkg/__init__.py": "",
    "pkg/py.typed": "",
    "pkg/testing/contract.py": "",
    "pkg/migrations/0001_initial.py": "",
    "pkg/sql/postgresql.sql": "",
    "pkg/contrib/app/templates/admin/app/page.html": "",
    "pkg/contrib/app/static/app/page.js": "",
}
SOURCE_ONLY = {"pkg/sql/README.md": "", "setup.cfg": "", "pyproject.toml": "",
               "README.md": ""}
DIST_INFO = ["METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt"]


@pytest.fixture(scope="module")
def check_dist() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / "scripts/check_dist.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def source(tmp_path: Path) -> Path:
    tree = tmp_path / "src"
    for name, text in {**PACKAGE_FILES, **SOURCE_ONLY}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    (tree / "setup.cfg").write_text("[metadata]\nlong_description = file: README.md\n")
    return tree


def wheel(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "")
    return path


def sdist(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name in names:
            archive.addfile(tarfile.TarInfo(f"pkg-1.0/{name}"), io.BytesIO(b""))
    return path


GOOD_WHEEL = [*PACKAGE_FILES, *(f"pkg-1.0.dist-info/{name}" for name in DIST_INFO)]
GOOD_SDIST = [*PACKAGE_FILES, "PKG-INFO", "setup.cfg", "pyproject.toml", "README.md",
              "pkg.egg-info/SOURCES.txt"]


def run(check_dist: ModuleType, source: Path, whl: Path, sdist: Path, capsys) -> tuple[int, str]:
    status = check_dist.main(["--source", str(source), str(whl), str(sdist)])
    return status, capsys.readouterr().out


def test_the_package_files_and_nothing_else_pass(check_dist, source, tmp_path, capsys):
    status, out = run(check_dist, source, wheel(tmp_path, GOOD_WHEEL),
                      sdist(tmp_path, GOOD_SDIST), capsys)
    assert status == 0, out
    assert "not shipped (by design): pkg/sql/README.md" in out
    assert "WARNING: no license file" in out


def test_strays_and_missing_files_are_each_named(check_dist, source, tmp_path, capsys):
    strays = ["tests/test_pkg.py", "docs/index.md", "pkg/__pycache__/x.cpython-311.pyc",
              "pkg/sql/README.md", "pkg/contrib/app/templates/admin/.DS_Store"]
    whl = wheel(tmp_path, [n for n in GOOD_WHEEL if not n.endswith("page.js")] + strays)
    half = [n for n in GOOD_SDIST if n != "README.md"] + ["tests/test_pkg.py"]
    status, out = run(check_dist, source, whl, sdist(tmp_path, half), capsys)
    assert status == 1
    problems = [line.strip() for line in out.splitlines()
                if line.strip().startswith(("wheel: ", "sdist: "))]
    assert sorted(problems) == sorted([
        "wheel: tests/test_pkg.py: outside the package",
        "wheel: docs/index.md: outside the package",
        "wheel: pkg/__pycache__/x.cpython-311.pyc: compiled Python",
        "wheel: pkg/sql/README.md: not an SQL file",
        "wheel: pkg/contrib/app/templates/admin/.DS_Store: hidden file",
        "wheel: pkg/contrib/app/static/app/page.js: missing",
        "sdist: pkg-1.0/tests/test_pkg.py: not needed to build the wheel",
        "sdist: pkg-1.0/README.md: missing",
    ]), out


def test_a_license_file_of_the_source_must_be_in_both(check_dist, source, tmp_path, capsys):
    (source / "LICENSE").write_text("")
    status, out = run(check_dist, source, wheel(tmp_path, GOOD_WHEEL),
                      sdist(tmp_path, GOOD_SDIST), capsys)
    assert status == 1
    assert "wheel: pkg-1.0.dist-info/licenses/LICENSE: missing" in out
    assert "sdist: pkg-1.0/LICENSE: missing" in out
    status, out = run(
        check_dist, source, wheel(tmp_path, [*GOOD_WHEEL, "pkg-1.0.dist-info/licenses/LICENSE"]),
        sdist(tmp_path, [*GOOD_SDIST, "LICENSE"]), capsys,
    )
    assert status == 0, out
