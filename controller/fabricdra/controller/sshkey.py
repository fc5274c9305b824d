"""A one-off Ed25519 SSH key pair in OpenSSH's formats, for the fabric check's MPI launch
(fabriccheckrun.py): `mpirun` in the launcher pod reaches the worker pods' sshd with it, as
MPI Operator's launchers do. Made by the controller and kept only in the check's Secret, which
is deleted with the check (the controller image has no ssh-keygen, and the key must exist
before the pods that use it start).

The key and both files come from `cryptography` (the Python Cryptographic Authority's library,
OpenSSL underneath): a maintained, reviewed implementation of the curve and of OpenSSH's
`openssh-key-v1` private key format (unencrypted), where this module used to carry its own
RFC 8032 arithmetic. It is a declared dependency (pyproject.toml) pinned with hashes in the
image's lock (deployments/container/requirements.lock)."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_SEED = 32  # an Ed25519 private key is its 32-byte seed (RFC 8032 section 5.1.5)


def _key(seed: bytes) -> Ed25519PrivateKey:
    if len(seed) != _SEED:
        raise ValueError(f"an Ed25519 private key is {_SEED} bytes, not {len(seed)}")
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key(seed: bytes) -> bytes:
    """The 32-byte Ed25519 public key of a 32-byte private key (seed)."""
    return (
        _key(seed)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def openssh_pair(seed: bytes, comment: str = "fabricdra-fabric-check") -> tuple[str, str]:
    """(private key file, public key line) in OpenSSH's formats."""
    key = _key(seed)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, f"{public.decode()} {comment}\n"


def new_pair() -> tuple[str, str]:
    return openssh_pair(os.urandom(_SEED))
