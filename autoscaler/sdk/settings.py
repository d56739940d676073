"""Where the server is and which token to use, resolved the way the CLI does it:
an explicit argument, then `AUTOSCALER_SERVER` / `AUTOSCALER_TOKEN`, then the files
`autoscaler up` writes in its home directory (`AUTOSCALER_HOME`, default ~/.autoscaler):
`server.url` and `admin.token`. An empty environment variable counts as unset."""

from __future__ import annotations

import os
from pathlib import Path

from autoscaler.config import default_home

DEFAULT_SERVER = "http://127.0.0.1:8080"


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
    if token:
        return token
    if os.environ.get("AUTOSCALER_TOKEN"):
        return os.environ["AUTOSCALER_TOKEN"]
    token_file = (home or default_home()) / "admin.token"
    if token_file.exists():
        return token_file.read_text().strip()
    return None
