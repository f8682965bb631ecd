"""Keys and credentials of the local plane: service-account signing keys and a static admin token.

openssl is used (not a Python crypto package) so the plane adds no dependency; the serving
certificate is self-signed by kube-apiserver itself (``--cert-dir``).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Final

from kvretention_devtools.localcluster.errors import ClusterError

ADMIN_USER: Final = "kvr-admin"
ADMIN_GROUP: Final = "system:masters"


def generate_service_account_keys(private_key: Path, public_key: Path) -> None:
    """An RSA pair: kube-apiserver signs and verifies SA tokens, controller-manager mints them."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ClusterError("openssl is not installed (apt-get install openssl)")
    _run(
        [
            openssl,
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            str(private_key),
        ]
    )
    _run([openssl, "pkey", "-in", str(private_key), "-pubout", "-out", str(public_key)])
    private_key.chmod(0o600)


def new_token() -> str:
    return secrets.token_hex(24)


def build_token_file(token: str) -> str:
    """kube-apiserver's ``--token-auth-file`` line: token,user,uid,"groups"."""
    return f'{token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n'


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
