"""The settings of suite ``stampede``'s django-cacheops processes: the benchmarks' own,
with cacheops installed on the same Redis (cacheops patches every queryset when its app
is ready, so the other suites' processes never load it)."""

import os

from .settings import *  # noqa: F403
from .settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "cacheops"]
CACHEOPS_REDIS = os.environ.get("DISTLOCK_REDIS_URL", "")
#: ``cached_as(PlainProduct)`` needs a cache profile for the model; no query is cached.
CACHEOPS = {"shopbench.plainproduct": {"ops": (), "timeout": 1}}
