"""Every model of the test app (see the package docstring)."""

from .admin_models import *  # noqa: F403
from .fencing_models import *  # noqa: F403
from .optimistic_models import *  # noqa: F403
