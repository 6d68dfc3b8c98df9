"""CURVE keys of a run: one cluster key pair that every process of the run holds.

Scheme (docs/architecture.md §6): workers join and leave at any time and their identities are not
known in advance, so there is no per-worker allow list to keep in sync. Instead every
process (workers, coordinator) holds the run's one key pair, from files or a
Kubernetes Secret:

- servers (the data PULL, the exchange ROUTER) use it as their CURVE server key pair;
- clients (PUSH, DEALER) use it as their client key pair and know the server key;
- a ZAP handler on every server admits only clients whose public key is the cluster
  public key (noloco_rt.net.transport.enable_curve). A CURVE handshake makes a client
  prove it holds the secret key of the public key it presents, so only holders of the
  cluster secret get in. Without the ZAP check any client knowing the (public) server
  key could connect with a key pair of its own.

Key files are z85 text (40 characters): `<name>.secret` and `<name>.public`. The
secret alone is enough (the public key is derived from it); when both are given they
must match. Certificates written by zmq.auth.create_certificates (`<name>.key_secret`)
are read too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from noloco_rt.config import ConfigError, NetworkConfig

Z85_KEY_CHARS = 40
SECRET_SUFFIX = ".secret"
PUBLIC_SUFFIX = ".public"


@dataclass(frozen=True)
class CurveKeys:
    """The run's key pair, z85-encoded (40 bytes each), as socket options want them."""

    public_key: bytes
    secret_key: bytes

    @property
    def authorized_clients(self) -> frozenset[bytes]:
        """Client public keys servers admit: the cluster key only."""
        return frozenset({self.public_key})

    def __repr__(self) -> str:  # never print the secret
        return f"CurveKeys(public_key={self.public_key.decode()!r})"


def parse_z85_key(text: str | bytes, field_name: str, value_for_error: str) -> bytes:
    """A 40-character z85 key (surrounding whitespace ignored) or ConfigError naming where it came from."""
    raw = text.encode() if isinstance(text, str) else text
    raw = raw.strip()
    if len(raw) != Z85_KEY_CHARS:
        raise ConfigError(field_name, value_for_error, f"a CURVE key is {Z85_KEY_CHARS} z85 characters, "
                          f"got {len(raw)} (generate one with `noloco-rt keys generate`)")
    try:
        decoded = z85.decode(raw)
    except (ValueError, KeyError, IndexError):
        decoded = b""
    if len(decoded) != 32:
        raise ConfigError(field_name, value_for_error, "is not a z85-encoded CURVE key")
    return raw


def keys_from_values(secret: str | bytes, public: str | bytes, *, secret_field: str, public_field: str,
                     secret_origin: str, public_origin: str) -> CurveKeys:
    """Validate a secret key (and, if given, its public key) and derive the pair."""
    secret_key = parse_z85_key(secret, secret_field, secret_origin)
    derived = zmq.curve_public(secret_key)
    if public:
        public_key = parse_z85_key(public, public_field, public_origin)
        if public_key != derived:
            raise ConfigError(public_field, public_origin, "does not match the secret key "
                              f"({secret_origin}): the two files are not one key pair")
    return CurveKeys(public_key=derived, secret_key=secret_key)


def _read(path: Path, field_name: str) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(field_name, str(path), f"cannot read the key file: {exc.strerror or exc}") from None


def keys_from_dir(directory: str | os.PathLike[str], field_name: str = "network.curve_key_dir") -> CurveKeys:
    """The one key pair in `directory` (`<name>.secret` [+ `<name>.public`] or `<name>.key_secret`)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(field_name, str(folder), "is not a directory (it should hold <name>.secret and "
                          "<name>.public from `noloco-rt keys generate`)")
    secrets = sorted(folder.glob(f"*{SECRET_SUFFIX}"))
    certificates = sorted(folder.glob("*.key_secret"))
    found = secrets + certificates
    if len(found) != 1:
        listed = ", ".join(p.name for p in found) or "none"
        raise ConfigError(field_name, str(folder), f"must hold exactly one secret key file (*{SECRET_SUFFIX} or "
                          f"*.key_secret), found {listed}")
    path = found[0]
    if certificates:
        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(field_name, str(path), f"is not a valid ZeroMQ certificate: {exc}") from None
        if not secret:
            raise ConfigError(field_name, str(path), "holds no secret key")
        return keys_from_values(secret, public, secret_field=field_name, public_field=field_name,
                                secret_origin=str(path), public_origin=str(path))
    public_path = path.with_suffix(PUBLIC_SUFFIX)
    public = _read(public_path, field_name) if public_path.exists() else ""
    return keys_from_values(_read(path, field_name), public, secret_field=field_name, public_field=field_name,
                            secret_origin=str(path), public_origin=str(public_path))


def load_curve_keys(network: NetworkConfig) -> CurveKeys | None:
    """The run's keys from network.curve_key_dir or network.curve_secret_key; None: CURVE off."""
    if network.curve_key_dir:
        return keys_from_dir(network.curve_key_dir)
    if network.curve_secret_key:
        return keys_from_values(network.curve_secret_key, network.curve_public_key,
                                secret_field="network.curve_secret_key", public_field="network.curve_public_key",
                                secret_origin="<hidden>", public_origin=network.curve_public_key)
    return None


def write_key_pair(out_dir: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """A fresh pair as `<name>.public` and `<name>.secret`, both 0600 (the docs promise the pair
    stays private; a public key alone grants nothing, but it names the run); refuses to
    overwrite unless force."""
    public_path, secret_path = out_dir / f"{name}{PUBLIC_SUFFIX}", out_dir / f"{name}{SECRET_SUFFIX}"
    existing = [p for p in (public_path, secret_path) if p.exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(map(str, existing))} already exist(s); use --force to replace")
    out_dir.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    # Created 0600 from the start: no window where others can read them.
    for path, key in ((secret_path, secret), (public_path, public)):
        if path.exists():
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key.decode() + "\n")
    return public_path, secret_path
