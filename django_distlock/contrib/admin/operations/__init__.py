"""What an operator does with held locks, shared by the admin's pages (:mod:`..views`,
:mod:`..bulk`) and the ``manage.py distlock`` command:

- :mod:`.listing`: a page of held locks across the aliases that can list, one lock;
- :mod:`.ordered`: the merged view by age; :mod:`.totals`: counts per alias;
- :mod:`.waiting`: who waits for a lock;
- :mod:`.release`, :mod:`.bulk`: force releases, each sent as an operator signal with
  who and why (the audit app records them).
"""
