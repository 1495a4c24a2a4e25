"""The performance benchmark of django-mysqlq: ``python -m bench.perf`` (see __main__)."""
