"""Secret task environment: sealed at rest with AES-256-GCM, opened only for the lease.

A task's `secret_env` is stored as one sealed string per value, keyed by the variable's
name (names are not secret; they are shown, values never are). Each value is sealed
with the server's current key and bound to its task and name (the AES-GCM associated
data), so a sealed value copied into another task, or under another name, does not
open.

Keys live in a key file (`server.secret_key_file`, default `HOME/secret.key`, mode
0600, created on the server's first start). One key per line, base64url of 32 random
bytes; blank lines and `#` comments are ignored. The FIRST key seals new values; every
key in the file opens values sealed with it. Rotation: put a new key on the first line,
keep the old ones below it until no stored task needs them (`autoscaler secret-key
rotate` does the first step; docs/api.md has the whole procedure).

Sealed form: `v1.<key id>.<base64url(nonce || ciphertext+tag)>`, where the key id is
the first 8 hex digits of SHA-256 of the key (it names the key, it reveals nothing
usable about it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from autoscaler.errors import AutoscalerError, ConfigError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

MASK = "***"
KEY_BYTES = 32
NONCE_BYTES = 12
VERSION = "v1"
DEFAULT_KEY_FILE = "secret.key"
_AAD_PREFIX = b"autoscaler task secret_env v1\x00"


class SecretUnavailable(AutoscalerError):
    """A sealed value cannot be opened with the keys this server has."""

    http_status = 500


def mask(env: Mapping[str, object] | None) -> dict[str, str]:
    """What everyone but the leasing worker sees of a secret env: its names."""
    return {name: MASK for name in (env or {})}


def new_key() -> str:
    """A fresh key in key-file form (base64url, no padding)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).rstrip(b"=").decode()


def _decode_key(text: str, where: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: not a base64url key; make one with `autoscaler secret-key rotate`") from None
    if len(raw) != KEY_BYTES:
        raise ConfigError(f"{where}: a key must be {KEY_BYTES} bytes (base64url), this one is {len(raw)}")
    return raw


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def _aad(task_id: str, name: str) -> bytes:
    return _AAD_PREFIX + task_id.encode() + b"\x00" + name.encode()


@dataclass(frozen=True)
class SecretKeys:
    """The server's key ring: `keys[0]` seals, every key opens."""

    keys: tuple[bytes, ...]
    source: str = "memory"

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError(f"{self.source}: no secret key in it; the first line must be a key")
        for k in self.keys:
            if len(k) != KEY_BYTES:
                raise ConfigError(f"{self.source}: every key must be {KEY_BYTES} bytes")

    @classmethod
    def generate(cls) -> SecretKeys:
        """A ring with one fresh in-memory key (tests, throwaway servers)."""
        return cls((os.urandom(KEY_BYTES),))

    @classmethod
    def parse(cls, text: str, source: str) -> SecretKeys:
        keys: list[bytes] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keys.append(_decode_key(line, f"{source}:{number}"))
        return cls(tuple(keys), source)

    @property
    def ids(self) -> list[str]:
        return [key_id(k) for k in self.keys]

    def seal(self, task_id: str, name: str, value: str) -> str:
        key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(key).encrypt(nonce, value.encode(), _aad(task_id, name))
        return f"{VERSION}.{key_id(key)}.{base64.urlsafe_b64encode(nonce + sealed).rstrip(b'=').decode()}"

    def open(self, task_id: str, name: str, sealed: str) -> str:
        version, _, rest = sealed.partition(".")
        kid, _, body = rest.partition(".")
        if version != VERSION or not kid or not body:
            raise SecretUnavailable(f"secret_env {name}: not a sealed value this server understands")
        keys = [k for k in self.keys if key_id(k) == kid]
        if not keys:
            raise SecretUnavailable(
                f"secret_env {name} was sealed with key {kid}, which is not in {self.source} "
                f"(keys there: {', '.join(self.ids)}); put that key back below the current one"
            )
        try:
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise SecretUnavailable(f"secret_env {name}: the sealed value is corrupt") from None
        for key in keys:
            try:
                return AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(task_id, name)).decode()
            except InvalidTag:
                continue
        raise SecretUnavailable(f"secret_env {name}: the sealed value does not open (altered, or not this task's)")

    def seal_all(self, task_id: str, env: Mapping[str, str]) -> dict[str, str]:
        return {name: self.seal(task_id, name, value) for name, value in env.items()}

    def open_all(self, task_id: str, sealed: Mapping[str, str] | None) -> dict[str, str]:
        return {name: self.open(task_id, name, value) for name, value in (sealed or {}).items()}


def load_key_file(path: Path, *, create: bool) -> SecretKeys:
    """Read the key ring from `path`; with `create`, make the file (0600) with one fresh
    key if it does not exist yet."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(
                    "# Keys sealing task secret_env. The first key seals new values; every key opens.\n"
                    "# Rotate: `autoscaler secret-key rotate`. Losing this file loses queued tasks' secrets.\n"
                    f"{new_key()}\n"
                )
            log.warning("created secret key file %s (mode 0600): back it up with the database", path)
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: secret key file not found: start the server once to create it, or set "
            "server.secret_key_file / AUTOSCALER_SECRET_KEY_FILE"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the secret key file: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("secret key file %s is readable by group or others (mode %o): chmod 600 it", path, mode & 0o777)
    return SecretKeys.parse(text, str(path))


def rotate_key_file(path: Path) -> tuple[str, list[str]]:
    """Put a fresh key on the first line of the key file, keeping the others below it.
    Returns the new key's id and the ids kept for opening older values."""
    old = load_key_file(path, create=False) if path.exists() else None
    key = new_key()
    lines = [line for line in (path.read_text().splitlines() if old else []) if line.strip()]
    comments = [line for line in lines if line.strip().startswith("#")]
    keys = [line.strip() for line in lines if not line.strip().startswith("#")]
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("\n".join([*comments, key, *keys]) + "\n")
    os.replace(tmp, path)
    return key_id(_decode_key(key, str(path))), old.ids if old else []


def reseal_tasks(session: Session, keys: SecretKeys) -> tuple[int, set[str]]:
    """Seal every stored secret env again with the current key (after a rotation).
    Returns how many tasks were resealed and the key ids stored values used before."""
    from sqlalchemy import select

    from autoscaler.state.models import Task

    used: set[str] = set()
    count = 0
    for task in session.scalars(select(Task).where(Task.secret_env.is_not(None)).with_for_update()):
        if not task.secret_env:
            continue
        used.update(str(v).split(".")[1] for v in task.secret_env.values() if str(v).count(".") >= 2)
        task.secret_env = keys.seal_all(task.id, keys.open_all(task.id, task.secret_env))
        count += 1
    return count, used
