"""`probe launch --make-cert DIR`: a certificate for one job, for TLS across nodes.

A token proof names the address the CLI dialled, which stops a relay between nodes, but behind
NAT or a port mapping the two sides see different addresses: TLS is the mode that holds there.
This makes what it needs with the ``cryptography`` package (imported only here, only then):

- a CA of the job's own, whose certificate (``ca.pem``) is what the CLI pins with ``--cacert``;
  its private key is never written, so nothing can mint another certificate it vouches for;
- one certificate for the agents (``cert.pem``, key ``key.pem``, 0600), for the names and
  addresses of every node given (``--cert-host``), this node's by default.

In a shared directory every node's launch finds the files the first one made and uses them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import click

FILES = ("ca.pem", "cert.pem", "key.pem")
#: A job's certificate outlives any job; a stolen one is useless after this.
VALID_DAYS = 30


def default_hosts() -> list[str]:
    """This node: its name, loopback, and the addresses its name resolves to."""
    name = socket.gethostname()
    hosts = [name, "localhost", "127.0.0.1", "::1"]
    try:
        hosts += sorted({str(a[4][0]) for a in socket.getaddrinfo(name, None)})
    except OSError:
        pass
    return list(dict.fromkeys(hosts))


def make_job_cert(folder: str, hosts: list[str]) -> tuple[str, str, str, bool]:
    """(ca.pem, cert.pem, key.pem, made) in ``folder``; made False when they were there."""
    paths = tuple(os.path.join(folder, f) for f in FILES)
    if all(os.path.exists(p) for p in paths):
        return (*paths, False)  # type: ignore[return-value]
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise click.UsageError("--make-cert needs the cryptography package: pip install "
                               "cryptography (or make a CA and PROBE_TLS_CERT/KEY yourself)"
                               ) from None
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid():
        raise click.UsageError(f"--make-cert {folder}: not a directory of yours")
    now = datetime.datetime.now(datetime.timezone.utc)
    until = now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe job CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(h))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "probe agent")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    blobs = {
        paths[0]: ca.public_bytes(pem),
        paths[1]: leaf.public_bytes(pem),
        paths[2]: key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()),
    }
    for path, blob in blobs.items():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:  # another node's launch made them at the same moment
            return (*paths, False)  # type: ignore[return-value]
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
    return (*paths, True)  # type: ignore[return-value]
