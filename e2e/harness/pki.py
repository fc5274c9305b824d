"""Certificates and keys for a throwaway cluster, made with the `openssl` command.

openssl is on every machine this runs on, so the harness adds no Python dependency for it.
Keys are RSA 2048: EC would be faster but the apiserver's service-account signer and every
client here accept RSA, and generation takes well under a second each.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.errors import HarnessError

_CLIENT_EXT = "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise HarnessError("the harness needs the `openssl` command (apt-get install openssl)")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HarnessError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


class Pki:
    """A CA in `directory` and the certificates it signs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=fabricdra-e2e-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            cwd=directory,
        )

    def _sign(self, name: str, subject: str, extensions: str) -> KeyPair:
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            subject,
            cwd=self.dir,
        )
        (self.dir / f"{name}.ext").write_text(extensions)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-out",
            f"{name}.crt",
            "-extfile",
            f"{name}.ext",
            cwd=self.dir,
        )
        (self.dir / f"{name}.csr").unlink()
        (self.dir / f"{name}.ext").unlink()
        return KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")

    def serving(self, name: str, dns: list[str], ips: list[str]) -> KeyPair:
        san = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips])
        return self._sign(
            name,
            f"/CN={name}",
            f"subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n",
        )

    def client(self, name: str, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate: CN is the Kubernetes user name, each O a group."""
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        return self._sign(name, subject, _CLIENT_EXT)

    def rsa_key_pair(self, name: str) -> KeyPair:
        """A bare RSA key pair (private .key, public .pub) for service-account token signing."""
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=self.dir)
        _openssl("rsa", "-in", f"{name}.key", "-pubout", "-out", f"{name}.pub", cwd=self.dir)
        return KeyPair(self.dir / f"{name}.pub", self.dir / f"{name}.key")
