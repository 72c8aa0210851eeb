"""A small shop project that exercises django-distlock (see ``manage.py flashsale``)."""
