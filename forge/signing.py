"""Signed plans and cache entries: HMAC-SHA256 with a key the user controls, so planted or edited code is refused.

Why: a plan or a kernel-cache entry carries generated source that is imported into the process that loads it. A
`source_sha256` next to the source proves nothing (demonstrated: an attacker replaced the source and recomputed the
hash, or deleted the key, and `kforge plan verify` and `plan.apply` ran the code; a planted cache entry was imported by
the next `kforge optimize` with no LLM call and no sandbox). A MAC needs a secret the attacker does not have.

- The key: `$KFORGE_SIGNING_KEY` (hex of at least 32 digits is decoded, any other text is used as its UTF-8 bytes),
  else the file `$KFORGE_SIGNING_KEY_FILE`, else `~/.config/kforge/signing.key`. `load_key(create=True)` (used by
  `kforge plan sign` and the kernel cache) writes a new random 32-byte key there, mode 0600, when there is none.
- What is signed: the canonical JSON (sorted keys, no spaces, UTF-8, NaN refused) of the whole document minus its
  `signature` block, together with the block's own fields (signer, key id, time), so neither the source, the entry
  point, the signatures, the metadata nor the claimed signer can change without the MAC changing. Python's JSON
  round-trips floats exactly, so a document re-read from disk has the same canonical bytes.
- The block: `{"algorithm": "hmac-sha256", "signer": ..., "key_id": <first 8 hex of sha256(key)>, "signed_at":
  ..., "mac": <hex>}`. The signer is `$KFORGE_SIGNER`, else user@host; it is a label, authenticated by the key.

HMAC rather than public-key signatures: the producer and the consumer of a plan are usually the same user or team
sharing a secret, the standard library has it (no new dependency), and verification is one hash (~40 us for a
100 KB plan). `hmac.compare_digest` keeps the comparison constant-time.
"""

from __future__ import annotations

import datetime as _dt
import enum
import getpass
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ALGORITHM",
    "SIGNATURE_KEY",
    "SignatureCheck",
    "SignatureStatus",
    "SigningKey",
    "check_document",
    "default_key_file",
    "load_key",
    "sign_document",
    "signer_name",
]

logger = logging.getLogger(__name__)

ALGORITHM = "hmac-sha256"
SIGNATURE_KEY = "signature"
SIGNATURE_FIELDS = frozenset({"algorithm", "signer", "key_id", "signed_at", "mac"})
_HEX_KEY = re.compile(r"(?:[0-9a-fA-F]{2}){16,}")


@dataclass(frozen=True)
class SigningKey:
    """A secret and where it came from (`origin`: the variable or the file); `created` when this call wrote it."""

    secret: bytes
    origin: str
    created: bool = False

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError(f"the signing key from {self.origin} is empty")

    @property
    def key_id(self) -> str:
        """First 8 hex digits of sha256(secret): names the key without revealing it."""
        return hashlib.sha256(self.secret).hexdigest()[:8]

    def __repr__(self) -> str:  # never print the secret
        return f"SigningKey(key_id={self.key_id!r}, origin={self.origin!r})"


class SignatureStatus(enum.Enum):
    VALID = "signed"
    UNSIGNED = "unsigned"
    NO_KEY = "signed, but no signing key is configured here"
    OTHER_KEY = "signed with another key"
    INVALID = "signature does not match (edited after signing)"
    MALFORMED = "malformed signature block"


@dataclass(frozen=True)
class SignatureCheck:
    """The outcome of `check_document`; `signer`/`key_id`/`signed_at` are what the block claims (None if absent)."""

    status: SignatureStatus
    signer: str | None = None
    key_id: str | None = None
    signed_at: str | None = None

    @property
    def valid(self) -> bool:
        return self.status is SignatureStatus.VALID

    def describe(self) -> str:
        """One line for people: `signed by alice@box (key 1a2b3c4d, 2026-11-30T16:00:00+00:00)` or the problem."""
        if self.status is SignatureStatus.UNSIGNED:
            return "unsigned"
        claim = f"by {self.signer} (key {self.key_id}, {self.signed_at})" if self.signer else ""
        if self.valid:
            return f"signed {claim}"
        return f"{self.status.value}{': claims ' + claim if claim else ''}"


# ---------------------------------------------------------------------------------------------------------
# the key
# ---------------------------------------------------------------------------------------------------------
def default_key_file() -> Path:
    """`$KFORGE_SIGNING_KEY_FILE`, else `~/.config/kforge/signing.key`."""
    named = os.environ.get("KFORGE_SIGNING_KEY_FILE")
    return Path(named).expanduser() if named else Path.home() / ".config" / "kforge" / "signing.key"


def _decode(text: str) -> bytes:
    text = text.strip()
    return bytes.fromhex(text) if _HEX_KEY.fullmatch(text) else text.encode("utf-8")


def load_key(*, create: bool = False) -> SigningKey | None:
    """The configured key (environment, then key file); None when there is none and `create` is False.

    With `create`, a missing key file is written with a new random key (mode 0600, folder 0700); the returned key
    has `created=True` so the caller can say so. A key file that others may read or write is refused.
    """
    value = os.environ.get("KFORGE_SIGNING_KEY")
    if value:
        return SigningKey(_decode(value), "$KFORGE_SIGNING_KEY")
    path = default_key_file()
    try:
        return _read_key_file(path)
    except FileNotFoundError:
        if not create:
            return None
    return _create_key_file(path)


def _read_key_file(path: Path) -> SigningKey:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"signing key file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise ValueError(f"signing key file {path} is accessible by other users (mode "
                             f"{stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}`")
        text = os.read(fd, 4096).decode("utf-8", errors="strict")
    finally:
        os.close(fd)
    return SigningKey(_decode(text), str(path))


def _create_key_file(path: Path) -> SigningKey:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:  # another process created it meanwhile: use that one
        return _read_key_file(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    logger.warning("created a new signing key in %s (mode 0600); keep it private", path)
    return SigningKey(bytes.fromhex(text), str(path), created=True)


def signer_name() -> str:
    """`$KFORGE_SIGNER`, else user@host."""
    named = os.environ.get("KFORGE_SIGNER")
    if named:
        return named
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without passwd entry)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


# ---------------------------------------------------------------------------------------------------------
# signing and checking
# ---------------------------------------------------------------------------------------------------------
def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _mac(secret: bytes, document: dict[str, Any], block: dict[str, Any]) -> str:
    body = {k: v for k, v in document.items() if k != SIGNATURE_KEY}
    claims = {k: v for k, v in block.items() if k != "mac"}
    return hmac.new(secret, _canonical({"document": body, "signature": claims}), hashlib.sha256).hexdigest()


def sign_document(document: dict[str, Any], key: SigningKey, signer: str | None = None) -> dict[str, Any]:
    """A copy of `document` with a `signature` block (any previous one replaced)."""
    block = {
        "algorithm": ALGORITHM,
        "signer": signer or signer_name(),
        "key_id": key.key_id,
        "signed_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    block["mac"] = _mac(key.secret, document, block)
    return {**{k: v for k, v in document.items() if k != SIGNATURE_KEY}, SIGNATURE_KEY: block}


def check_document(document: dict[str, Any], key: SigningKey | None) -> SignatureCheck:
    """Whether `document` carries a valid signature under `key` (None: no key here, so it cannot be checked)."""
    block = document.get(SIGNATURE_KEY)
    if block is None:
        return SignatureCheck(SignatureStatus.UNSIGNED)
    if (not isinstance(block, dict) or set(block) != SIGNATURE_FIELDS or block.get("algorithm") != ALGORITHM
            or not all(isinstance(block[f], str) for f in SIGNATURE_FIELDS)):
        return SignatureCheck(SignatureStatus.MALFORMED)
    claims = {"signer": block["signer"], "key_id": block["key_id"], "signed_at": block["signed_at"]}
    if key is None:
        return SignatureCheck(SignatureStatus.NO_KEY, **claims)
    if not hmac.compare_digest(block["key_id"], key.key_id):
        return SignatureCheck(SignatureStatus.OTHER_KEY, **claims)
    if not hmac.compare_digest(block["mac"], _mac(key.secret, document, block)):
        return SignatureCheck(SignatureStatus.INVALID, **claims)
    return SignatureCheck(SignatureStatus.VALID, **claims)
