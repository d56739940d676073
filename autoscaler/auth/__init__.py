"""Bearer tokens: creation, hashing at rest, resolution to a principal, and roles."""
