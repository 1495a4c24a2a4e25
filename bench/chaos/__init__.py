"""The chaos run of django-mysqlq: ``python -m bench.chaos`` (see ``__main__``)."""
