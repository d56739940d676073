"""SDK tests use the agent harness (a real server on 127.0.0.1, real agent processes)."""

from tests.agent.conftest import db_url, harness  # noqa: F401  (fixtures)
