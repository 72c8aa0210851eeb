"""Sphinx configuration: the docs/ pages (Markdown, through myst-parser) and the API
reference generated from the package's docstrings (docs/api.md).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (``tox -e docs``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The package and the testproject import from the repository root, as in the tests.
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django  # noqa: E402

import django_distlock  # noqa: E402

# autodoc imports the models (fencing, optimistic mixins), which needs a set-up Django.
django.setup()

project = "django-distlock"
author = "django-distlock contributors"
copyright = "django-distlock contributors"
release = django_distlock.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
# plans/: working notes for developers, not pages of the site.
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "plans"]

myst_enable_extensions = ["colon_fence", "deflist"]
# "## Section" titles become link targets, so a page's [text](page.md#section) resolves.
myst_heading_anchors = 3

# autodoc: members in source order, the signature's type hints in the description.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# Members are named in docs/api.md, one module at a time (re-exports stay out).
autodoc_default_options = {"show-inheritance": True}
# A reference the site cannot resolve (a name of Django, redis-py, kazoo, the typing
# module) stays plain text; -W still fails on every other warning.
nitpicky = False

html_theme = "alabaster"
html_title = f"django-distlock {release}"
html_theme_options = {
    "description": "Distributed locks for Django",
    "fixed_sidebar": True,
    "page_width": "1100px",
}
