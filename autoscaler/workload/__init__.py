"""What a task carries, built on the submitting side (code snapshots)."""
