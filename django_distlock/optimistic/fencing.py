"""Fenced writes moved to :mod:`django_distlock.fencing`; this path stays for the imports
and the migrations (``django_distlock.optimistic.fencing.FencingTokenField``) that name it."""

from ..fencing import *  # noqa: F403  (every public name of django_distlock.fencing)
from ..fencing import __all__ as __all__
