"""Elastic queue semantics: enqueue, atomic lease, complete, cancel, requeue."""
