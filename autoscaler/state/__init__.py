"""Durable state: SQLAlchemy 2.0 models, the engine/session factory and Alembic migrations."""
