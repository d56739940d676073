"""Alert delivery: the reconcile cycle records which alerts are due (`due`), a separate
job sends them to the configured channels with backoff (`deliver`, `channels`)."""
