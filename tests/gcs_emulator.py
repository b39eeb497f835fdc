"""A local Cloud Storage emulator that TensorFlow's built-in ``gs://`` filesystem can use.

TensorFlow's GCS filesystem (tsl/platform/cloud/gcs_file_system.cc) has no endpoint
override: the JSON API base ``https://www.googleapis.com/storage/v1/``, the upload base
``https://www.googleapis.com/upload/storage/v1/`` and the read host
``https://storage.googleapis.com/<bucket>/<object>`` are compile-time constants. What it
does have is libcurl, which honours ``https_proxy`` (TF never sets CURLOPT_PROXY), and
``CURL_CA_BUNDLE`` (read by curl_http_request.cc for every request). So the emulator is
reached like this:

    TF --CONNECT www.googleapis.com:443--> tunnel proxy on 127.0.0.1 (this module)
       --TLS, certificate from a throw-away CA that CURL_CA_BUNDLE names-->
       plain HTTP to gcp-storage-emulator (PyPI) on 127.0.0.1

The proxy only accepts CONNECT to www.googleapis.com:443 and storage.googleapis.com:443,
and only ever connects to the emulator on 127.0.0.1: nothing leaves the machine. Auth is
skipped with ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (google_auth_provider.cc), which also keeps
TF from probing the GCE metadata server.

TF reads its ``GCS_*`` settings once, when the filesystem is registered at import, so the
TF side must run in a process started with :meth:`EmulatorProcess.tf_env` already in its
environment. ``python tests/gcs_emulator.py serve`` runs the emulator and the proxy; it
prints one JSON line with the ports and the CA file, and exits when its stdin closes.

Needs ``gcp-storage-emulator`` and ``cryptography`` (the latter comes with apache-beam).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import logging
import os
import select
import signal
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

EMULATED_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
IO_TIMEOUT = 60          # seconds, per socket operation inside the proxy
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 512 * 1024 * 1024
MAX_REQUESTS_PER_TUNNEL = 100
TEST_TOKEN = "gcs-emulator-test-token"
_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "transfer-encoding",
               "expect", "host", "content-length", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate"}
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
               "ALL_PROXY", "no_proxy", "NO_PROXY")


def missing_requirements() -> str | None:
    """Why the emulator cannot run here, or None when it can."""
    for module, package in (("gcp_storage_emulator", "gcp-storage-emulator"),
                            ("cryptography", "cryptography")):
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed (pip install {package})"
    return None


# --------------------------------------------------------------------------- TLS files
def make_tls_files(directory: str) -> tuple[str, str, str]:
    """A throw-away CA and a leaf certificate for the emulated Google hosts.

    Returns (ca_pem, leaf_cert_pem, leaf_key_pem) paths under `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gcs-emulator test CA")])
    ca_cert = (x509.CertificateBuilder()
               .subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                              critical=False)
               .sign(ca_key, hashes.SHA256()))
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (x509.CertificateBuilder()
                 .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                             EMULATED_HOSTS[0])]))
                 .issuer_name(ca_name)
                 .public_key(leaf_key.public_key())
                 .serial_number(x509.random_serial_number())
                 .not_valid_before(start).not_valid_after(end)
                 .add_extension(x509.SubjectAlternativeName(
                     [x509.DNSName(h) for h in EMULATED_HOSTS]), critical=False)
                 .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                critical=True)
                 .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                critical=False)
                 .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                     ca_key.public_key()), critical=False)
                 .sign(ca_key, hashes.SHA256()))
    os.makedirs(directory, exist_ok=True)
    paths = tuple(os.path.join(directory, n) for n in ("ca.pem", "leaf.pem", "leaf-key.pem"))
    pem = serialization.Encoding.PEM
    with open(paths[0], "wb") as f:
        f.write(ca_cert.public_bytes(pem))
    with open(paths[1], "wb") as f:
        f.write(leaf_cert.public_bytes(pem))
    with open(paths[2], "wb") as f:
        f.write(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return paths  # type: ignore[return-value]


# --------------------------------------------------------------------------- the proxy
class _BadRequest(Exception):
    pass


def _read_head(read_line) -> tuple[str, list[tuple[str, str]]]:
    """The request line and headers, read with `read_line` (bounded)."""
    total = 0
    lines = []
    while True:
        line = read_line(MAX_HEADER_BYTES + 1)
        if not line:
            raise _BadRequest("connection closed")
        total += len(line)
        if total > MAX_HEADER_BYTES or len(lines) > 200:
            raise _BadRequest("header too large")
        line = line.decode("latin-1").rstrip("\r\n")
        if not line:
            break
        lines.append(line)
    if not lines:
        raise _BadRequest("empty request")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(f"bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers, name, default=None):
    for k, v in headers:
        if k.lower() == name:
            return v
    return default


def _read_body(rfile, headers) -> bytes:
    if _header(headers, "transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        for _ in range(1_000_000):
            size = int(rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline(MAX_HEADER_BYTES).strip():  # trailers
                    pass
                return bytes(body)
            if len(body) + size > MAX_BODY_BYTES:
                raise _BadRequest("body too large")
            body += rfile.read(size)
            rfile.readline(8)
        raise _BadRequest("too many chunks")
    length = int(_header(headers, "content-length", "0") or 0)
    if length < 0 or length > MAX_BODY_BYTES:
        raise _BadRequest("bad content-length")
    body = rfile.read(length)
    if len(body) != length:
        raise _BadRequest("short body")
    return body


def _response(status: int, reason: str, headers=(), body: bytes = b"") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}"]
    head += [f"{k}: {v}" for k, v in headers]
    head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


def _empty_multipart(path: str) -> tuple[bytes, str]:
    """A multipart upload body for an empty object named in `path`'s query."""
    from urllib.parse import parse_qs, urlsplit
    name = parse_qs(urlsplit(path).query).get("name", [""])[0]
    boundary = "gcs-emulator-boundary"
    body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
            f"{json.dumps({'name': name})}\r\n"
            f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n"
            f"--{boundary}--\r\n").encode()
    return body, f"multipart/related; boundary={boundary}"


class _TunnelHandler(socketserver.BaseRequestHandler):
    """CONNECT host:443 -> TLS with the test certificate -> HTTP to the emulator."""

    def handle(self):
        sock = self.request
        sock.settimeout(IO_TIMEOUT)
        raw = b""
        deadline = time.monotonic() + IO_TIMEOUT
        while b"\r\n\r\n" not in raw:
            if len(raw) > MAX_HEADER_BYTES or time.monotonic() > deadline:
                return
            chunk = sock.recv(4096)
            if not chunk:
                return
            raw += chunk
        request_line = raw.split(b"\r\n", 1)[0].decode("latin-1").split()
        target = request_line[1] if len(request_line) == 3 else ""
        host, _, port = target.rpartition(":")
        if request_line[:1] != ["CONNECT"] or host not in EMULATED_HOSTS or port != "443":
            sock.sendall(_response(403, "Forbidden", body=b"only the emulated GCS hosts\n"))
            return
        sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        try:
            tls = self.server.ssl_context.wrap_socket(sock, server_side=True)
        except (ssl.SSLError, OSError) as e:
            logging.warning("TLS handshake for %s failed: %s", host, e)
            return
        with tls:
            rfile = tls.makefile("rb")
            try:
                for _ in range(MAX_REQUESTS_PER_TUNNEL):
                    if not self._one_request(host, rfile, tls):
                        break
            except (_BadRequest, OSError, ValueError) as e:
                logging.debug("tunnel to %s ended: %s", host, e)
            finally:
                rfile.close()

    def _one_request(self, host, rfile, tls) -> bool:
        try:
            request_line, headers = _read_head(rfile.readline)
        except _BadRequest:
            return False
        method, path, _version = request_line.split(" ", 2)
        if _header(headers, "expect", "").lower() == "100-continue":
            tls.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, headers)
        emu_host, emu_port = self.server.emulator_address
        if host == "storage.googleapis.com":
            # Reads: GET https://storage.googleapis.com/<bucket>/<escaped object>.
            bucket, _, obj = path.lstrip("/").partition("/")
            obj, _, query = obj.partition("?")
            path = f"/download/storage/v1/b/{bucket}/o/{obj}?alt=media"
            if query:
                path += "&" + query
        elif method == "POST" and not body and "uploadType=media" in path:
            # TF creates directory markers with an empty media upload, which
            # gcp-storage-emulator cannot take (len(None)); send it as multipart.
            body, content_type = _empty_multipart(path)
            path = path.replace("uploadType=media", "uploadType=multipart")
            headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
            headers.append(("Content-Type", content_type))
        fwd = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        fwd.append(("Host", f"{emu_host}:{emu_port}"))
        if body or method in ("POST", "PUT", "PATCH"):
            fwd.append(("Content-Length", str(len(body))))
        conn = http.client.HTTPConnection(emu_host, emu_port, timeout=IO_TIMEOUT)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in fwd:
                conn.putheader(k, v)
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = resp.read()
            status, reason, resp_headers = resp.status, resp.reason, resp.getheaders()
        finally:
            conn.close()
        emulator_base = f"http://{emu_host}:{emu_port}"
        out = []
        for k, v in resp_headers:
            if k.lower() in _HOP_BY_HOP:
                continue
            if k.lower() == "location" and v.startswith(emulator_base):
                # Resumable upload session URIs: keep them on the tunnelled https host.
                v = "https://www.googleapis.com" + v[len(emulator_base):]
            out.append((k, v))
        tls.sendall(_response(status, reason, out, b"" if method == "HEAD" else data))
        return False  # Connection: close; libcurl opens a new tunnel per request anyway


class _TunnelServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def serve(workdir: str, ready_out=sys.stdout) -> None:
    """Runs the emulator and the tunnel proxy until stdin closes or SIGTERM."""
    logging.basicConfig(level=logging.WARNING)
    for name in ("gcp_storage_emulator", "api.object", "api.bucket", "api.storage",
                 "gcp_storage_emulator.server"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from gcp_storage_emulator.server import create_server

    ca, cert, key = make_tls_files(os.path.join(workdir, "tls"))
    emulator = create_server("127.0.0.1", 0, in_memory=True)
    emulator.start()
    emu_port = emulator._api._httpd.server_address[1]  # bound to port 0: the real port

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    proxy = _TunnelServer(("127.0.0.1", 0), _TunnelHandler)
    proxy.ssl_context = ctx
    proxy.emulator_address = ("127.0.0.1", emu_port)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ready_out.write(json.dumps({"emulator_port": emu_port,
                                "proxy_port": proxy.server_address[1],
                                "ca_file": ca}) + "\n")
    ready_out.flush()

    def watch_stdin():
        try:
            while sys.stdin.read(1024):
                pass
        except (OSError, ValueError):
            pass
        stop.set()
    threading.Thread(target=watch_stdin, daemon=True).start()
    stop.wait()
    proxy.shutdown()
    proxy.server_close()
    emulator.stop()


# --------------------------------------------------------------------------- client side
class EmulatorProcess:
    """`python tests/gcs_emulator.py serve` in a subprocess, with helpers for tests."""

    def __init__(self, workdir: str, start_timeout: float = 60):
        self.workdir = workdir
        env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", "--workdir", workdir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, text=True)
        self._stderr: list[str] = []
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()
        line = ""
        deadline = time.monotonic() + start_timeout
        while not line.endswith("\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                err = self.stop()
                raise RuntimeError(f"the GCS emulator did not start: {err[-2000:]}")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                c = self.proc.stdout.readline()
                if not c:
                    continue
                line += c
        info = json.loads(line)
        self.emulator_port = info["emulator_port"]
        self.proxy_port = info["proxy_port"]
        self.ca_file = info["ca_file"]

    def _call(self, method: str, path: str, payload=None, timeout: float = 30):
        """A JSON API call straight to the emulator (no proxy)."""
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.emulator_port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def create_bucket(self, name: str) -> None:
        try:
            self._call("POST", "/storage/v1/b", {"name": name})
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def upload(self, bucket: str, name: str, data: bytes, timeout: float = 60) -> None:
        """Writes object `name` (a simple media upload straight to the emulator, no TF)."""
        from urllib.parse import quote
        if not data:
            raise ValueError("the emulator cannot take an empty media upload")
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.emulator_port}/upload/storage/v1/b/{bucket}/o"
            f"?uploadType=media&name={quote(name, safe='')}", data=data, method="POST",
            headers={"Content-Type": "application/octet-stream"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=timeout) as r:
            r.read()

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        from urllib.parse import quote
        path = f"/storage/v1/b/{bucket}/o"
        if prefix:
            path += "?prefix=" + quote(prefix, safe="")
        return [item["name"] for item in (self._call("GET", path) or {}).get("items", [])]

    def tf_env(self, base=None) -> dict:
        """The environment a TensorFlow process needs to use this emulator for gs://."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in _PROXY_VARS}
        proxy = f"http://127.0.0.1:{self.proxy_port}"
        env.update({
            "https_proxy": proxy, "HTTPS_PROXY": proxy,
            "CURL_CA_BUNDLE": self.ca_file,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TEST_TOKEN,
            "NO_GCE_CHECK": "true",
            # Bound every request and the retries (defaults: 10 retries, 32 s backoff).
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
            "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000",
            "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
            "GCS_REQUEST_IDLE_TIMEOUT_SECS": "30",
            "GCS_METADATA_REQUEST_TIMEOUT_SECS": "30",
            "GCS_READ_REQUEST_TIMEOUT_SECS": "60",
            "GCS_WRITE_REQUEST_TIMEOUT_SECS": "60",
        })
        return env

    def stop(self) -> str:
        """Stops the server (closing its stdin ends it); returns the end of its stderr."""
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self._stderr_thread.join(timeout=5)
        return "".join(self._stderr)[-20000:]

    def stderr_tail(self, n: int = 3000) -> str:
        """The end of what the server has written to stderr so far."""
        return "".join(self._stderr)[-n:]

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self._stderr.append(line)
            if len(self._stderr) > 2000:
                del self._stderr[:1000]


try:
    import pytest
except ImportError:  # serve mode needs no pytest
    pytest = None

if pytest is not None:
    @pytest.fixture(scope="module")
    def gcs_emulator(tmp_path_factory):
        """A running emulator (EmulatorProcess) with the bucket 'electra-test' created."""
        why = missing_requirements()
        if why:
            pytest.skip(f"GCS emulator test skipped: {why}")
        emu = EmulatorProcess(str(tmp_path_factory.mktemp("gcs_emulator")))
        try:
            emu.create_bucket("electra-test")
            yield emu
        finally:
            emu.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the emulator and the tunnel proxy")
    s.add_argument("--workdir", required=True)
    args = parser.parse_args()
    serve(args.workdir)
