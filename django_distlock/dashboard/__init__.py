"""The admin's pages: held locks (:mod:`.views`) and the audit trail's activity charts
(:mod:`.activity`, :mod:`.charts`). The services they share with the ``distlock``
command are in :mod:`django_distlock.operations`."""
