"""Credentials of the control plane: the admin token, tenants' submit tokens, job tokens.

Contract
--------
* Tokens are bearer secrets; the service keeps only their SHA-256 (``hash_token``) and
  compares hashes in constant time, so a token of any characters is just a wrong token.
* The admin token comes from $ROLLMUX_ADMIN_TOKEN, else from a file (``--admin-token-file``,
  by default ``<state file>.admin-token``); a missing file is created with a fresh
  token, mode 0600, so the token survives restarts. It never appears on a command line.
* Tenants (``--tenants FILE``, YAML ``{tenants: {name: {token_sha256: HEX}}}``) may
  submit jobs with their own token; ``rollmux admin tenant-token NAME`` makes one. A
  tenant's entry may also bound its live jobs (``max_live_jobs``) and the GPUs they ask
  for, rollout and training together (``max_gpus``): ``Quota``.
* Job ids: ``rollmux.model.JOB_ID_PATTERN``, letters, digits, ``.``,
  ``_`` and ``-``, starting with a letter or digit, at most 128 characters: safe in URLs,
  file names and logs.
"""
from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rollmux import strict_yaml
from rollmux.errors import SpecError, TraceFormatError
from rollmux.runtime.store import hash_token
from rollmux.text_file import read_text

ADMIN_TOKEN_ENV = "ROLLMUX_ADMIN_TOKEN"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
ADMIN = "admin"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def same(token: str, digest: str) -> bool:
    """Whether ``token`` hashes to ``digest`` (constant time in the digest)."""
    return secrets.compare_digest(hash_token(token), digest)


@dataclass(slots=True)
class Credentials:
    """Who may do what: the admin token's hash and each tenant's submit-token hash. A
    token must name one submitter: a tenant's token that is the admin's is refused
    (``SpecError``), else the tenant's quota would silently not apply."""

    admin_hash: str
    tenants: dict[str, str] = field(default_factory=dict)  # tenant -> token sha256

    def __post_init__(self) -> None:
        for name, digest in self.tenants.items():
            if secrets.compare_digest(digest, self.admin_hash):
                raise SpecError(f"tenants.{name}.token_sha256", "<the admin token's hash>",
                                "the hash of a token of its own, not the admin token's")

    def submitter(self, token: str) -> str | None:
        """``ADMIN`` for the admin token, a tenant's name for its token, else None."""
        digest = hash_token(token)
        found = ADMIN if secrets.compare_digest(digest, self.admin_hash) else None
        for name, h in self.tenants.items():
            if secrets.compare_digest(digest, h):
                found = found or name
        return found

    def is_admin(self, token: str) -> bool:
        return secrets.compare_digest(hash_token(token), self.admin_hash)


def admin_token(token_file: str | Path | None, state_path: str | Path) -> tuple[str, str]:
    """The admin token and where it came from (env, or a file created if missing)."""
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if token:
        return token, f"${ADMIN_TOKEN_ENV}"
    path = Path(token_file) if token_file else Path(f"{state_path}.admin-token")
    if path.is_dir():
        raise SpecError("--admin-token-file", str(path), "a file holding the admin token (or to create), not a folder")
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise SpecError("--admin-token-file", str(path), "a file holding the admin token (it is empty)")
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
        return token, str(path)
    token = new_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token + "\n")
    return token, f"{path} (new)"


@dataclass(slots=True, frozen=True)
class Quota:
    """What one tenant's live jobs (waiting or running) may hold at once; None: no bound."""

    max_live_jobs: int | None = None
    max_gpus: int | None = None  # rollout plus training GPUs, as the jobs ask for them


@dataclass(slots=True, frozen=True)
class Tenants:
    """A tenants file: each tenant's token hash, and its quota where the file sets one."""

    hashes: dict[str, str] = field(default_factory=dict)
    quotas: dict[str, Quota] = field(default_factory=dict)


_TENANT_KEYS = ("token_sha256", "max_live_jobs", "max_gpus")


def load_tenants(path: str | Path | None) -> Tenants:
    """The tenants of a tenants YAML (see the module docstring); every error names the
    file and the field."""
    if path is None:
        return Tenants()
    try:
        data = strict_yaml.load(read_text(path))
    except (OSError, yaml.YAMLError, TraceFormatError) as exc:
        raise SpecError("--tenants", str(path), f"a readable YAML file ({exc})") from exc
    shape = "a mapping {tenants: {name: {token_sha256: HEX, max_live_jobs: N, max_gpus: N}}}"
    if not isinstance(data, dict):
        raise SpecError("(top level)", type(data).__name__, shape, str(path))
    extra = [k for k in data if k != "tenants"]
    if extra:  # e.g. a tenant's key indented one level too little
        raise SpecError(str(extra[0]), data[extra[0]], f"only the key 'tenants' at the top level: {shape}", str(path))
    if not isinstance(data.get("tenants"), dict):
        raise SpecError("tenants", type(data.get("tenants")).__name__, shape, str(path))
    out = Tenants()
    owner: dict[str, str] = {}  # token hash -> the tenant that has it
    for name, entry in data["tenants"].items():
        if not isinstance(name, str) or not TENANT_PATTERN.fullmatch(name):
            raise SpecError("tenants", name, "a tenant name of letters, digits, '.', '_', '-' (<= 64)", str(path))
        if not isinstance(entry, dict):
            raise SpecError(f"tenants.{name}", entry, "a mapping {token_sha256: HEX, max_live_jobs: N, max_gpus: N}",
                            str(path))
        digest = entry.get("token_sha256")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise SpecError(f"tenants.{name}.token_sha256", digest, "64 lowercase hex digits (SHA-256 of the token)",
                            str(path))
        if name == ADMIN:
            raise SpecError("tenants", name, "a name other than 'admin'", str(path))
        if digest in owner:
            raise SpecError(f"tenants.{name}.token_sha256", digest,
                            f"a token of its own (tenant {owner[digest]!r} has the same one)", str(path))
        owner[digest] = name
        unknown = [k for k in entry if k not in _TENANT_KEYS]
        if unknown:
            raise SpecError(f"tenants.{name}.{unknown[0]}", entry[unknown[0]],
                            f"one of the keys {', '.join(_TENANT_KEYS)}", str(path))
        bounds = {}
        for key in ("max_live_jobs", "max_gpus"):
            value = entry.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SpecError(f"tenants.{name}.{key}", value, "an integer >= 1, or absent (no bound)", str(path))
            bounds[key] = value
        out.hashes[name] = digest
        if any(v is not None for v in bounds.values()):
            out.quotas[name] = Quota(**bounds)
    return out
