"""The one HTTP layer between this package (and the CLI) and the API: JSON in and
out, bearer token, and every failure turned into a typed `SdkError` carrying the
server's message. Nothing here knows a route."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from autoscaler.sdk.errors import FeatureMissing, NotFoundError, SdkError, ServerUnreachable, from_status

# What FastAPI answers for a path it has no route for; a 404 from a route says what is missing.
NO_ROUTE = "Not Found"


# Never quotes the token: it is a credential.
BAD_TOKEN = (
    "the token holds characters an HTTP header cannot carry (not ASCII, a newline or a "
    "control character?); check --token or AUTOSCALER_TOKEN"
)


class Transport:
    def __init__(self, server: str, token: str | None, timeout: float = 30.0) -> None:
        if token and not (token.isascii() and token.isprintable()):
            raise SdkError(BAD_TOKEN)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        self._http = httpx.Client(base_url=server, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _unreachable(self, exc: httpx.HTTPError) -> ServerUnreachable:
        return ServerUnreachable(
            f"cannot reach the server at {self.server} ({exc.__class__.__name__}): is `autoscaler up` running? "
            "Set --server or AUTOSCALER_SERVER"
        )

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            body = response.json()
            detail = str(body.get("detail", response.text)) if isinstance(body, dict) else response.text
        except ValueError:
            detail = response.text
        raise from_status(response.status_code, detail)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.InvalidURL as exc:  # not an HTTPError: a path built from bad user text
            raise SdkError(f"cannot send {method} {path!r}: {exc}; check the id or name given") from None
        except httpx.LocalProtocolError:  # nothing was sent: a header HTTP cannot carry (never quoted: the token)
            raise SdkError(f"cannot send {method} {path!r}: {BAD_TOKEN}") from None
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        self._check(response)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body if body is not None else {})

    def post_file(self, path: str, file: Path, content_type: str) -> Any:
        """POST a file as the raw body, streamed from disk (snapshots can be large)."""
        with file.open("rb") as fh:
            return self.request("POST", path, content=fh, headers={"Content-Type": content_type})

    @contextmanager
    def stream(self, path: str) -> Iterator[httpx.Response]:
        """A GET whose body is read in chunks by the caller (artifact downloads)."""
        try:
            with self._http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                self._check(response)
                yield response
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None


def missing_feature(exc: SdkError, feature: str, endpoint: str, server: str) -> SdkError:
    """A 404 that FastAPI gave for a route it does not have becomes `FeatureMissing`
    saying which; a 404 a route gave (no such task) is passed on unchanged."""
    if isinstance(exc, NotFoundError) and exc.detail == NO_ROUTE:
        return FeatureMissing(
            f"the server at {server} has no {feature} ({endpoint} is not there): it is older than this SDK "
            "or was built without it; upgrade the server",
            status=404,
            detail=exc.detail,
        )
    return exc
