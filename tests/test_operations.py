"""The services of the admin and the ``distlock`` command live in
``django_distlock.operations``; their old paths under ``dashboard`` re-export them."""

from __future__ import annotations

import importlib

import pytest

from django_distlock.operations import listing


@pytest.mark.parametrize("name", ["listing", "release", "health"])
def test_the_old_dashboard_paths_re_export(name: str) -> None:
    old = importlib.import_module(f"django_distlock.dashboard.{name}")
    new = importlib.import_module(f"django_distlock.operations.{name}")
    assert old.__all__
    for attr in old.__all__:
        assert getattr(old, attr) is getattr(new, attr), attr


def test_page_cursors_signed_before_the_move_still_read() -> None:
    """The salt is unchanged, so a page link an operator kept keeps working."""
    assert listing.CURSOR_SALT == "django_distlock.dashboard.cursor"
    query = ("", "dash:")
    assert listing.unsign_position(listing.sign_position(("x", "c"), query), query) == ("x", "c")
