"""The chaos run's Django app: what producers committed, what tasks did, and when."""
