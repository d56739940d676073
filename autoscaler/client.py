"""A small HTTP client for the API, used by the CLI (not by the agent, which has its own).

Server URL and token come from flags, then `AUTOSCALER_SERVER` / `AUTOSCALER_TOKEN`,
then the files `autoscaler up` writes in its home directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from autoscaler.config import default_home
from autoscaler.errors import AutoscalerError

DEFAULT_SERVER = "http://127.0.0.1:8080"


class ClientError(AutoscalerError):
    """The server refused the request or could not be reached; the message says why."""


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


class ApiClient:
    def __init__(self, server: str, token: str | None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        self._http = httpx.Client(base_url=server, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"cannot reach the server at {self.server} ({exc.__class__.__name__}): is `autoscaler up` running? "
                "Set --server or AUTOSCALER_SERVER"
            ) from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ClientError(f"{response.status_code}: {detail}")
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def upload(self, path: str, src: Path) -> Any:
        """POST a file as the raw body, streamed from disk (a code snapshot)."""

        def blocks() -> Iterator[bytes]:
            with src.open("rb") as fh:
                yield from iter(lambda: fh.read(1024 * 1024), b"")

        headers = {"Content-Type": "application/gzip"}
        return self.request("POST", path, content=blocks(), headers=headers, timeout=None)

    def download(self, path: str, dest: Path) -> int:
        """GET into a file, streamed; the bytes written."""
        try:
            with self._http.stream("GET", path, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    try:
                        detail = r.json().get("detail", r.text)
                    except ValueError:
                        detail = r.text
                    raise ClientError(f"{r.status_code}: {detail}")
                size = 0
                with dest.open("wb") as fh:
                    for block in r.iter_bytes(1024 * 1024):
                        fh.write(block)
                        size += len(block)
                return size
        except httpx.HTTPError as exc:
            raise ClientError(f"download from {self.server} failed ({exc.__class__.__name__}); try again") from None
