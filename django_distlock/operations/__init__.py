"""What an operator does with held locks, shared by the admin's pages (:mod:`..dashboard`)
and the ``manage.py distlock`` command:

- :mod:`.listing`: a page of held locks across the aliases that can list, one lock;
- :mod:`.release`: a force release written to the audit trail with who and why;
- :mod:`.health`: each alias' health (and the JSON view for load balancers).
"""
