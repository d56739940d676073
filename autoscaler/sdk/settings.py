"""Where the server is and which token to use, resolved the way the CLI does it:
an explicit argument, then `AUTOSCALER_SERVER` / `AUTOSCALER_TOKEN`, then the files
`autoscaler up` writes in its home directory (`AUTOSCALER_HOME`, default ~/.autoscaler):
`server.url` and `admin.token`. An empty environment variable counts as unset."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_SERVER = "http://127.0.0.1:8080"


def default_home() -> Path:
    """Where `autoscaler up` keeps its files: the same rule as autoscaler.config.default_home,
    repeated here because importing the config module (pydantic-settings and every model
    of autoscaler.yaml) costs a script half a second for one path."""
    return Path(os.environ.get("AUTOSCALER_HOME", Path.home() / ".autoscaler"))


def resolve_server(server: str | None, home: Path | None = None) -> str:
    if server:
        return server.rstrip("/")
    if os.environ.get("AUTOSCALER_SERVER"):
        return os.environ["AUTOSCALER_SERVER"].rstrip("/")
    url_file = (home or default_home()) / "server.url"
    if url_file.exists():
        return url_file.read_text().strip().rstrip("/")
    return DEFAULT_SERVER


def resolve_token(token: str | None, home: Path | None = None) -> str | None:
    # A token never holds whitespace: a pasted one often ends in a space or newline,
    # which no HTTP header may carry.
    if token and token.strip():
        return token.strip()
    if os.environ.get("AUTOSCALER_TOKEN", "").strip():
        return os.environ["AUTOSCALER_TOKEN"].strip()
    token_file = (home or default_home()) / "admin.token"
    if token_file.exists():
        return token_file.read_text().strip()
    return None
