"""Benchmarks of django-mysqlq (``python -m bench.perf``) and its chaos test."""
