"""The README's and docs' integration snippets are complete as written: each one
marked ``<!-- project-snippet -->`` (or ``<!-- project-snippet urls.py -->``) before
its code block is copied into a fresh project (the files ``startproject`` writes,
made here), which must pass ``manage.py check``, migrate, and answer 200 at every
``path()`` the snippet adds.

In a block, a ``# settings.py`` or ``# urls.py`` line says where the lines below it
go (default: the marker's file, else settings.py); ``[..., "app"]`` means the
project's list with ``"app"`` added. A snippet of URLs only is added to a project that
followed the README's install (``"django_distlock"`` in ``INSTALLED_APPS``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_versions

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/usage.md", "docs/settings.md", "docs/admin-dashboard.md"]
MARKER = re.compile(
    r"<!-- project-snippet(?: (?P<file>[\w.]+))? -->\s*\n```python\n(?P<code>.*?)```", re.S
)
ELLIPSIS_LIST = re.compile(r"^(?P<name>[A-Z_]+) = \[\.\.\., ", re.M)
PATH = re.compile(r"""path\(\s*["']([^"'<]*)["']""")

STARTPROJECT_SETTINGS = '''
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "doc-snippets-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "site_snippet.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": BASE_DIR / "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
# The aliases the docs' snippets name, when a snippet does not set DISTLOCK itself.
DISTLOCK = {"default": {"BACKEND": "django_distlock.backends.database.DatabaseBackend"}}
if os.environ.get("DISTLOCK_REDIS_URL"):
    DISTLOCK["redis"] = {"BACKEND": "django_distlock.backends.redis.RedisBackend",
                         "LOCATION": os.environ["DISTLOCK_REDIS_URL"]}
'''

STARTPROJECT_URLS = '''
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
'''

MANAGE = '''
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_snippet.settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
'''

#: Run in the project: migrate, then GET each URL and print its status.
REQUESTS = '''
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_snippet.settings")
import django
django.setup()
from django.core.management import call_command
from django.test import Client
call_command("check", stdout=sys.stderr)
if len(sys.argv) > 1:
    call_command("migrate", verbosity=0)
for url in sys.argv[1:]:
    response = Client().get(url)
    print(url, response.status_code, flush=True)
    if response.status_code != 200:
        print(response.content[:2000].decode(errors="replace"), file=sys.stderr)
'''


@dataclass
class Snippet:
    where: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return ["/" + p for p in PATH.findall(self.files.get("urls.py", "")) if p != "admin/"]


def find_snippets() -> list[Snippet]:
    """Every marked snippet of :data:`DOCUMENTS`, split by target file."""
    found = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for match in MARKER.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            snippet = Snippet(f"{document}:{line}")
            target = match["file"] or "settings.py"
            for code_line in match["code"].splitlines():
                if code_line.strip() in ("# settings.py", "# urls.py"):
                    target = code_line.strip()[2:]
                    continue
                snippet.files[target] = snippet.files.get(target, "") + code_line + "\n"
            found.append(snippet)
    return found


SNIPPETS = find_snippets()


def make_project(directory: Path, snippet: Snippet) -> None:
    """The files ``startproject site_snippet`` writes, with ``snippet`` added."""
    package = directory / "site_snippet"
    package.mkdir(parents=True)
    (directory / "manage.py").write_text(MANAGE)
    (directory / "requests.py").write_text(REQUESTS)
    (package / "__init__.py").write_text("")
    # A snippet of URLs only comes after the README's install step.
    settings = snippet.files.get("settings.py", 'INSTALLED_APPS += ["django_distlock"]\n')
    settings = ELLIPSIS_LIST.sub(r"\g<name> = [*\g<name>, ", settings)
    (package / "settings.py").write_text(STARTPROJECT_SETTINGS + "\n" + settings)
    (package / "urls.py").write_text(STARTPROJECT_URLS + "\n" + snippet.files.get("urls.py", ""))


def run_project(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)]),
           "DJANGO_SETTINGS_MODULE": "site_snippet.settings"}
    return subprocess.run([sys.executable, *args], cwd=directory, env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def check_project(directory: Path, snippet: Snippet) -> str:
    """Run the project's checks (``manage.py check``'s, in the same process as the
    requests: one Django start) and requests; the failure's output, or '' when all
    pass."""
    answered = run_project(directory, "requests.py", *snippet.urls)
    statuses = dict(line.rsplit(" ", 1) for line in answered.stdout.splitlines())
    if answered.returncode != 0 or any(statuses.get(u) != "200" for u in snippet.urls):
        return f"requests {statuses}:\n{answered.stderr[-3000:]}"
    return ""


def test_the_documents_mark_their_integration_snippets() -> None:
    where = {s.where.split(":")[0] for s in SNIPPETS}
    assert {"README.md", "docs/usage.md", "docs/admin-dashboard.md"} <= where
    assert any("health_check" in s.files.get("urls.py", "") for s in SNIPPETS)
    assert any("prometheus" in s.files.get("urls.py", "") for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_works_in_a_fresh_project(tmp_path: Path, snippet: Snippet) -> None:
    if "health_check" in str(snippet.files):
        pytest.importorskip("health_check")
    if "prometheus" in str(snippet.files):
        pytest.importorskip("prometheus_client")
    make_project(tmp_path, snippet)
    assert check_project(tmp_path, snippet) == ""


def test_a_snippet_missing_an_installed_app_fails(tmp_path: Path) -> None:
    """The test can fail: the django-health-check snippet without ``"health_check"`` in
    ``INSTALLED_APPS`` (as it once was) renders no page."""
    pytest.importorskip("health_check")
    snippet = next(s for s in SNIPPETS if "health_check" in s.files.get("urls.py", ""))
    settings = snippet.files["settings.py"].replace('"health_check", ', "")
    assert settings != snippet.files["settings.py"]
    make_project(tmp_path, Snippet(snippet.where, {**snippet.files, "settings.py": settings}))
    assert check_project(tmp_path, snippet) != ""
