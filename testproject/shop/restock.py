"""The shop's periodic restock: a job every node fires on the same schedule, run once per slot.

Every node of the shop runs the same schedule (a crontab line calling
``manage.py restock``, Celery beat, or ``manage.py restock --every``), so every
node fires the restock for the same slot at about the same moment.
:func:`restock` is decorated with
:func:`~django_distlock.contrib.schedules.once_per_slot`: one node runs it, the others
skip at once. The system checks see the job in every process that imported this
module: ``manage.py restock`` does before its checks run. (The app's ``ready()``
does not import it: the test suite installs this app under settings whose
``"default"`` alias is sometimes a ZooKeeper or another backend without expiry.)
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F

from django_distlock.contrib.schedules import once_per_slot

from .models import Product

#: A product with fewer units left than this is restocked ...
RESTOCK_BELOW = 5
#: ... up to this many units.
RESTOCK_TO = 20
#: The demo's schedule: one slot a minute (a crontab line ``* * * * *``).
EVERY = 60.0
#: The lock is kept at least this long after a run: a node whose clock or cron is up
#: to 20 s late skips the slot already run, and the next slot (60 s on) is free.
MIN_HOLD = 20.0
#: The lease: a node that dies mid-restock frees the job after it.
MAX_HOLD = 50.0


def restock_products() -> int:
    """Bring every product below :data:`RESTOCK_BELOW` units back to :data:`RESTOCK_TO`.

    One ``UPDATE``; the version column is bumped, so an optimistic writer that read
    the old stock is refused instead of overwriting the restock.

    :returns: how many products were restocked.
    """
    with transaction.atomic():
        return Product.objects.filter(stock__lt=RESTOCK_BELOW).update(
            stock=RESTOCK_TO, version=F("version") + 1
        )


#: The job as every node's schedule calls it: returns the number of products restocked,
#: or None when another node has this slot.
restock = once_per_slot(
    "shop:restock", max_hold=MAX_HOLD, min_hold=MIN_HOLD, using="default"
)(restock_products)
