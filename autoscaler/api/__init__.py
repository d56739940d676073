"""HTTP API (FastAPI): routes per resource, auth dependencies, error mapping."""
