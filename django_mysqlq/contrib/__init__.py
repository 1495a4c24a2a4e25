"""Optional parts of django-mysqlq, each behind its own extra (nothing here is imported
by the app itself)."""
