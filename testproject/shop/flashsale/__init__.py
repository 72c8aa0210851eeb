"""The flash sale of ``manage.py flashsale``: many processes buy one product at once.

``strategies`` finds what to compare (no lock, and one strategy per
``DISTLOCK`` alias), ``store`` prepares the database, ``runner`` starts the
worker processes of ``worker`` and shows ``progress``, ``report`` prints the
table and the verdict.
"""
