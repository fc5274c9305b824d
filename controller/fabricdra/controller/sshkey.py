"""A one-off Ed25519 SSH key pair in OpenSSH's formats, for the fabric check's MPI launch
(fabriccheckrun.py): `mpirun` in the launcher pod reaches the worker pods' sshd with it, as
MPI Operator's launchers do. Made by the controller and kept only in the check's Secret, which
is deleted with the check (the controller image has no ssh-keygen, and the key must exist
before the pods that use it start).

The public key is derived from the 32-byte seed as RFC 8032 section 5.1.5 says (SHA-512 of the
seed, the lower half clamped, times the base point); the private key file is OpenSSH's
`openssh-key-v1` format, unencrypted (PROTOCOL.key in openssh-portable)."""

from __future__ import annotations

import base64
import hashlib
import os
import struct

# RFC 8032 section 5.1: edwards25519.
_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P
_BY = 4 * pow(5, _P - 2, _P) % _P
_I = pow(2, (_P - 1) // 4, _P)  # sqrt(-1)


def _recover_x(y: int, sign: int) -> int:
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P)
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P != 0:
        x = x * _I % _P
    if x & 1 != sign:
        x = _P - x
    return x


_BX = _recover_x(_BY, 0)
_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T)
_B: _Point = (_BX, _BY, 1, _BX * _BY % _P)


def _add(p: _Point, q: _Point) -> _Point:
    # RFC 8032 section 5.1.4, "add-2008-hwcd-3".
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _mul(s: int, p: _Point) -> _Point:
    q: _Point = (0, 1, 1, 0)  # the neutral element
    while s > 0:
        if s & 1:
            q = _add(q, p)
        p = _add(p, p)
        s >>= 1
    return q


def _encode(p: _Point) -> bytes:
    zinv = pow(p[2], _P - 2, _P)
    x, y = p[0] * zinv % _P, p[1] * zinv % _P
    return int.to_bytes(y | ((x & 1) << 255), 32, "little")


def public_key(seed: bytes) -> bytes:
    """The 32-byte Ed25519 public key of a 32-byte private key (seed)."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 private key is 32 bytes")
    h = hashlib.sha512(seed).digest()
    a = int.from_bytes(h[:32], "little")
    a &= (1 << 254) - 8
    a |= 1 << 254
    return _encode(_mul(a, _B))


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def openssh_pair(seed: bytes, comment: str = "fabricdra-fabric-check") -> tuple[str, str]:
    """(private key file, public key line) in OpenSSH's formats."""
    pub = public_key(seed)
    blob = _string(b"ssh-ed25519") + _string(pub)
    check = os.urandom(4)
    private = (
        check
        + check
        + _string(b"ssh-ed25519")
        + _string(pub)
        + _string(seed + pub)
        + _string(comment.encode())
    )
    pad = (-len(private)) % 8
    private += bytes(range(1, pad + 1))
    body = (
        b"openssh-key-v1\0"
        + _string(b"none")
        + _string(b"none")
        + _string(b"")
        + struct.pack(">I", 1)
        + _string(blob)
        + _string(private)
    )
    b64 = base64.b64encode(body).decode()
    lines = [b64[i : i + 70] for i in range(0, len(b64), 70)]
    text = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(lines)
    text += "\n-----END OPENSSH PRIVATE KEY-----\n"
    return text, f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}\n"


def new_pair() -> tuple[str, str]:
    return openssh_pair(os.urandom(32))
