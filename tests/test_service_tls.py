"""`rollmux serve` over https: a real server with a certificate made here, the SDK and the
CLI trusting it by ``ca_file`` or ``$ROLLMUX_CA_FILE``, refusing it without, and bad
certificate options refused before anything is served or written."""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loopback_server import free_port
from rollmux import Client
from rollmux.runtime.sdk import ClientError, UntrustedServer, WrongScheme

ROLLMUX = str(Path(sys.executable).with_name("rollmux"))
ADMIN = "tls-admin-token"


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _serve(tmp: Path, *tls: str, stdout=subprocess.DEVNULL) -> tuple[subprocess.Popen, int]:
    port = free_port()
    args = [ROLLMUX, "serve", "--state", str(tmp / "state.db"), "--port", str(port), "--lease-s", "30", *tls]
    return subprocess.Popen(args, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN)), port


def _serve_https(tmp: Path, *extra: str) -> tuple[subprocess.Popen, int, Path]:
    """``rollmux serve`` with a certificate made here, answering: (process, port, certificate)."""
    cert, key = _certificate(tmp, "service")
    proc, port = _serve(tmp, "--tls-cert", str(cert), "--tls-key", str(key), *extra)
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read()
        try:
            if httpx.get(f"https://127.0.0.1:{port}/healthz", verify=str(cert), timeout=1).status_code == 200:
                return proc, port, cert
        except httpx.TransportError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("the https server did not start") from None
            time.sleep(0.1)


@pytest.fixture
def https(tmp_path):
    """``rollmux serve`` with a certificate: (url, its certificate file)."""
    proc, port, cert = _serve_https(tmp_path)
    try:
        yield f"https://127.0.0.1:{port}", cert
    finally:
        proc.kill()
        proc.wait(10)


def test_a_job_runs_over_https_when_its_client_trusts_the_certificate(https, tmp_path):
    url, cert = https
    job = Client(url, ADMIN, ca_file=str(cert)).submit({"job_id": "a", "t_roll_s": 0.05, "t_train_s": 0.05,
                                                        "slo": 2.0, "iterations": 2})
    for _ in range(2):
        for name in ("rollout", "train"):
            with job.phase(name):
                time.sleep(0.01)
    assert job.view["state"] == "done"
    with pytest.raises(httpx.TransportError):  # plain http to the https port gets no answer
        httpx.get(url.replace("https", "http") + "/healthz", timeout=2)


def test_an_untrusted_certificate_is_refused_at_once_not_retried(https, tmp_path):
    url, _cert = https
    other, _ = _certificate(tmp_path, "other")
    for ca in (None, str(other)):
        t0 = time.monotonic()
        with pytest.raises(UntrustedServer, match="ca_file"):
            Client(url, ADMIN, give_up_s=30.0, ca_file=ca).submit({"job_id": "x", "t_roll_s": 1, "t_train_s": 1})
        assert time.monotonic() - t0 < 10  # not retried for give_up_s
    with pytest.raises(ClientError, match="ca_file"):
        Client(url, ADMIN, ca_file=str(tmp_path / "missing.pem"))


def test_an_https_url_to_a_plain_http_server_fails_at_once_with_a_hint(tmp_path):
    proc, port = _serve(tmp_path)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(WrongScheme, match="does not speak TLS"):
            Client(f"https://127.0.0.1:{port}", ADMIN, give_up_s=30.0).status()
        assert time.monotonic() - t0 < 10
    finally:
        proc.kill()
        proc.wait(10)


def test_the_cli_trusts_the_certificate_named_by_the_environment(https):
    url, cert = https
    env = dict(os.environ, ROLLMUX_ADMIN_TOKEN=ADMIN, ROLLMUX_URL=url)
    plain = subprocess.run([ROLLMUX, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode == 2 and "not trusted" in " ".join((plain.stdout + plain.stderr).split())
    trusted = subprocess.run([ROLLMUX, "status"], env={**env, "ROLLMUX_CA_FILE": str(cert)}, capture_output=True,
                             text=True, timeout=60)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr


@pytest.mark.parametrize("case", ["cert only", "missing key", "mismatched key", "not a certificate",
                                  "a key for the certificate", "a directory", "an encrypted key"])
def test_bad_certificate_options_are_refused_before_anything_is_written(tmp_path, case):
    cert, key = _certificate(tmp_path, "service")
    _, other_key = _certificate(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    locked = tmp_path / "locked.key"
    locked.write_bytes(serialization.load_pem_private_key(key.read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    tls, expected = {
        "cert only": (["--tls-cert", str(cert)], "--tls-cert needs --tls-key"),
        "missing key": (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "nope.key")], "--tls-key"),
        "mismatched key": (["--tls-cert", str(cert), "--tls-key", str(other_key)], "is not the private key of"),
        "not a certificate": (["--tls-cert", str(junk), "--tls-key", str(key)], "no PEM certificate"),
        "a key for the certificate": (["--tls-cert", str(key), "--tls-key", str(key)], "--tls-cert"),
        "a directory": (["--tls-cert", str(cert), "--tls-key", str(tmp_path)], "a directory, not a file"),
        "an encrypted key": (["--tls-cert", str(cert), "--tls-key", str(locked)], "the key is encrypted"),
    }[case]
    proc, _port = _serve(tmp_path, *tls, stdout=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2
    assert expected in " ".join((out + err).split())
    assert not (tmp_path / "state.db").exists()


def _closed_within(sock, limit_s: float) -> float:
    """Seconds until the server closes ``sock`` (reads nothing but the close), or inf."""
    t0 = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return float("inf")
    except OSError:  # reset, or a TLS alert on the way out
        pass
    return time.monotonic() - t0


def test_over_https_the_header_deadline_also_bounds_the_handshake(tmp_path):
    """``--header-timeout-s 1`` over https: a connection that sends no ClientHello, or
    trickles one, is cut off after about 1 s (asyncio alone gives a handshake 60 s, and
    the HTTP protocol sees a connection only after it), and one that shakes hands and
    then says nothing is closed after about 1 s more; a real client is served."""
    import ssl

    proc, port, cert = _serve_https(tmp_path, "--header-timeout-s", "1")
    url = f"https://127.0.0.1:{port}"
    try:
        context = ssl.create_default_context(cafile=str(cert))
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert 0.8 <= _closed_within(silent, 10.0) < 3.0
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        with pytest.raises(ssl.SSLWantReadError):
            context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1").do_handshake()
        hello = outgoing.read()
        with socket.create_connection(("127.0.0.1", port)) as trickle:
            t0 = time.monotonic()
            with pytest.raises(OSError):  # the server hangs up while the hello still trickles
                for k in range(len(hello) - 1):
                    trickle.sendall(hello[k:k + 1])
                    time.sleep(0.2)
                    assert time.monotonic() - t0 < 10.0, "the trickled handshake was never cut off"
            assert time.monotonic() - t0 < 3.5
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as shook:
            assert 0.8 <= _closed_within(shook, 10.0) < 3.0
        assert httpx.get(f"{url}/healthz", verify=str(cert), timeout=5).status_code == 200
    finally:
        proc.kill()
        proc.wait(10)
