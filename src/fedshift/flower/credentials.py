"""TLS certificates and SuperNode authentication keys for a Flower deployment.

``tls(folder, hosts)`` writes a self-signed CA (``ca.crt``) and a server certificate
(``server.pem`` / ``server.key``) valid for ``hosts`` (names and IP addresses) — what the
SuperLink serves (``--ssl-ca-certfile --ssl-certfile --ssl-keyfile``) and what SuperNodes
and ``flwr`` trust (``--root-certificates ca.crt``). ``node_keys(folder, n)`` writes one
ECDSA P-384 key pair per SuperNode in OpenSSH format (``node-I`` private, ``node-I.pub``
public): the SuperNode signs with the private key (``--auth-supernode-private-key``), the
SuperLink, started with ``--enable-supernode-auth``, accepts only nodes whose public key was
registered (``flwr supernode register node-I.pub``). For production, use certificates from
your own CA; these are for tests and private clusters.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def tls(folder: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 365):
    """Write ca.crt, server.pem and server.key into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fedshift flower CA"))
        .issuer_name(_name("fedshift flower CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_key_pem(key))
    paths["key"].chmod(0o600)
    return paths


def node_keys(folder: str | Path, n: int, start: int = 0) -> list[tuple[Path, Path]]:
    """Write ``n`` SuperNode key pairs (OpenSSH ECDSA P-384); returns (private, public)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(start, start + n):
        key = ec.generate_private_key(ec.SECP384R1())
        private = folder / f"node-{i}"
        public = folder / f"node-{i}.pub"
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
        private.chmod(0o600)
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            + b"\n"
        )
        out.append((private, public))
    return out
