"""Mutual TLS inside a cluster (``security.ssl.internal.*``, Flink's key).

A cluster has one pair of credentials: a self-signed certificate and its private key (PEM),
made when the cluster starts (skein's ``Security.new_credentials``: what a YARN application
gets from skein, so on YARN the application's own ``.skein.crt`` / ``.skein.pem`` serve) or
given as files. Every Thrift server and Arrow Flight data server of the cluster presents that
certificate and accepts only peers presenting it too (the certificate is its own and only
trust anchor: a peer without it, or with one of another cluster, fails the handshake); every
client presents it. Holding the key is what makes a process part of the cluster.

Files, not bytes, travel: processes of the cluster get the two paths in their configuration
(``security.ssl.internal.cert-file``, ``.key-file``), the key file readable by its owner only.
A client finds a local session's credentials under ``$YARNFLOW_HOME/clusters/<host>_<port>/``
(default ``~/.yarnflow``), where the session put them, so neither path is typed by hand.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import shutil
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import ConfigurationError

log = logging.getLogger(__name__)

#: the name the credentials' certificate carries (skein's): what a TLS client checks it against
CERT_NAME = "skein-internal"
CERT_FILE, KEY_FILE = "cluster.crt", "cluster.key"
#: how long a peer may take to complete the TLS handshake
HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TlsCredentials:
    """A cluster's certificate and key, as two PEM files."""

    cert_file: str
    key_file: str
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict, compare=False, repr=False)
    _sessions: dict[str, ssl.SSLSession] = field(default_factory=dict, compare=False, repr=False)

    @property
    def cert_pem(self) -> bytes:
        with open(self.cert_file, "rb") as f:
            return f.read()

    @property
    def key_pem(self) -> bytes:
        with open(self.key_file, "rb") as f:
            return f.read()

    def _context(self, server: bool) -> ssl.SSLContext:
        kind = "server" if server else "client"
        ctx = self._contexts.get(kind)
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = False  # the peer is checked by its certificate: the cluster's own
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_cert_chain(self.cert_file, self.key_file)
            ctx.load_verify_locations(cadata=self.cert_pem.decode("ascii"))
            self._contexts[kind] = ctx
        return ctx

    def server_context(self) -> ssl.SSLContext:
        return self._context(True)

    def session(self, address: str) -> ssl.SSLSession | None:
        """The TLS session of the last connection to ``address`` (its client context's), to
        resume: the handshake then skips the certificates and the key exchange."""
        return self._sessions.get(address)

    def remember_session(self, address: str, sock: Any) -> None:
        """Keep ``sock``'s session (a client socket of this client context) for the next
        connection to ``address``."""
        session = getattr(sock, "session", None)
        if session is not None and self._sessions.get(address) is not session:
            self._sessions[address] = session

    def client_context(self) -> ssl.SSLContext:
        return self._context(False)

    def flight_server_options(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightServerBase`` for mutual TLS."""
        cert = self.cert_pem
        return {"tls_certificates": [(cert, self.key_pem)], "verify_client": True, "root_certificates": cert}

    def flight_client_options(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.connect`` for mutual TLS."""
        cert = self.cert_pem
        return {"tls_root_certs": cert, "cert_chain": cert, "private_key": self.key_pem,
                "override_hostname": CERT_NAME}


def _write_private(folder: str, files: list[tuple[str, bytes]]) -> list[str]:
    """Write ``(name, data)`` files into ``folder`` (made 0700), each readable by its owner
    only (0600) and complete once its name appears; their paths."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    paths = []
    for name, data in files:
        path = os.path.join(folder, name)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def new_credentials(folder: str) -> TlsCredentials:
    """Make a cluster's credentials in ``folder`` (created, readable by its owner only)."""
    import skein

    made = skein.Security.new_credentials()
    cert, key = _write_private(folder, [(CERT_FILE, made.cert_bytes), (KEY_FILE, made.key_bytes)])
    return TlsCredentials(cert, key)


def clusters_dir() -> str:
    """Where sessions on this machine leave their credentials for clients."""
    return os.path.join(os.environ.get("YARNFLOW_HOME") or os.path.expanduser("~/.yarnflow"), "clusters")


def published_folder(address: str) -> str:
    return os.path.join(clusters_dir(), address.replace(":", "_").replace("/", "_"))


#: beside published credentials: the process that serves the address ("<pid> <start time>")
OWNER_FILE = "owner"


def publish(credentials: TlsCredentials, address: str, owner_pid: int | None = None) -> str:
    """Copy a session's credentials where clients on this machine find them by its address,
    with the process that serves that address (``owner_pid``, default this one): they belong
    to that process, and are ignored once it is gone (a session killed with SIGKILL leaves
    them; a later cluster may get the same port)."""
    import psutil

    folder = published_folder(address)
    pid = owner_pid if owner_pid is not None else os.getpid()
    owner = f"{pid} {psutil.Process(pid).create_time():.3f}".encode()
    _write_private(folder, [(CERT_FILE, credentials.cert_pem), (KEY_FILE, credentials.key_pem), (OWNER_FILE, owner)])
    return folder


def _owner_alive(folder: str) -> bool:
    """Whether the process that published ``folder`` still runs (the same process: its pid and
    its start time); False for a folder that names none (left by an older version)."""
    import psutil

    try:
        with open(os.path.join(folder, OWNER_FILE)) as fh:
            pid_text, started = fh.read().split()
    except (OSError, ValueError):
        return False
    try:
        return abs(psutil.Process(int(pid_text)).create_time() - float(started)) < 0.01
    except (psutil.Error, ValueError):
        return False


def unpublish(address: str) -> None:
    shutil.rmtree(published_folder(address), ignore_errors=True)


def storage_folder(config: Configuration) -> str:
    """Where a high-availability cluster keeps its credentials for its clients: beside its job
    data, ``<high-availability.storageDir>/<cluster id>/security`` ("" without a storage dir)."""
    storage = str(config[Options.HA_STORAGE_DIR] or "").rstrip("/")
    return f"{storage}/{config[Options.HA_CLUSTER_ID]}/security" if storage else ""


def publish_to_storage(credentials: TlsCredentials, config: Configuration) -> str:
    """Copy a high-availability cluster's credentials beside its job data, where its clients,
    which find the leader in ZooKeeper and not by an address, find them too (the storage dir
    must be private to the cluster's user: it holds its jobs' data already)."""
    import fsspec

    folder = storage_folder(config)
    fs, path = fsspec.core.url_to_fs(folder)
    fs.makedirs(path, exist_ok=True)
    for src, name in ((credentials.cert_file, CERT_FILE), (credentials.key_file, KEY_FILE)):
        with open(src, "rb") as s, fs.open(f"{path}/{name}", "wb") as f:
            f.write(s.read())
        if getattr(fs, "protocol", None) in ("file", ("file", "local")) or fs.__class__.__name__ == "LocalFileSystem":
            os.chmod(f"{path}/{name}", 0o600)
    return folder


def unpublish_from_storage(config: Configuration) -> None:
    import fsspec

    folder = storage_folder(config)
    if folder:
        fs, path = fsspec.core.url_to_fs(folder)
        try:
            fs.rm(path, recursive=True)
        except (OSError, FileNotFoundError):
            pass


_FROM_STORAGE: dict[str, TlsCredentials] = {}


def _from_storage(config: Configuration) -> TlsCredentials | None:
    """A high-availability cluster's credentials from its storage dir, copied (once a process)
    into a private local folder (ssl needs files), removed when the process exits; None when
    there are none."""
    import atexit
    import tempfile

    import fsspec

    folder = storage_folder(config)
    if not folder:
        return None
    known = _FROM_STORAGE.get(folder)
    if known is not None and os.path.exists(known.cert_file):
        return known
    fs, path = fsspec.core.url_to_fs(folder)
    try:
        cert, key = fs.cat_file(f"{path}/{CERT_FILE}"), fs.cat_file(f"{path}/{KEY_FILE}")
    except (OSError, FileNotFoundError):
        return None
    local = tempfile.mkdtemp(prefix="yarnflow-credentials-")
    atexit.register(shutil.rmtree, local, True)
    cert_path, key_path = _write_private(local, [(CERT_FILE, cert), (KEY_FILE, key)])
    found = _FROM_STORAGE[folder] = TlsCredentials(cert_path, key_path)
    return found


def internal_credentials(config: Configuration, address: str = "") -> TlsCredentials | None:
    """The credentials a process of the cluster (or a client of it at ``address``) uses, or None
    when ``security.ssl.internal.enabled`` is off. Raises ConfigurationError when it is on and
    no credentials can be found or read."""
    if not config[Options.SSL_INTERNAL]:
        return None
    cert, key = config[Options.SSL_INTERNAL_CERT], config[Options.SSL_INTERNAL_KEY]
    if not cert and not key and not address:
        container = skein_container_credentials()
        if container is not None:  # a YARN container: the application's own credentials
            cert, key = container.cert_file, container.key_file
    if not cert and not key and address:
        folder = published_folder(address)
        cert, key = os.path.join(folder, CERT_FILE), os.path.join(folder, KEY_FILE)
        if not os.path.exists(cert):
            raise ConfigurationError(
                f"{Options.SSL_INTERNAL.key} is on but no credentials for the cluster at {address} were found "
                f"(a session on this machine leaves them in {folder}); give "
                f"{Options.SSL_INTERNAL_CERT.key} and {Options.SSL_INTERNAL_KEY.key}")
    if not cert or not key:
        raise ConfigurationError(f"{Options.SSL_INTERNAL.key} is on: give both {Options.SSL_INTERNAL_CERT.key} "
                                 f"and {Options.SSL_INTERNAL_KEY.key} (PEM files)")
    try:
        stamp = (cert, key, os.stat(cert).st_mtime_ns, os.stat(key).st_mtime_ns)
    except OSError as exc:
        raise ConfigurationError(f"cannot use the TLS credentials {cert} / {key}: {exc}") from None
    with _loaded_lock:
        credentials = _loaded.get(stamp)
    if credentials is not None:  # (one per process and files: its contexts, and the sessions they resume)
        return credentials
    credentials = TlsCredentials(cert, key)
    try:
        credentials.server_context()
        credentials.client_context()
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use the TLS credentials {cert} / {key}: {exc}") from None
    with _loaded_lock:
        return _loaded.setdefault(stamp, credentials)


#: credentials loaded by internal_credentials, by files and their modification times
_loaded: dict[tuple[str, str, int, int], TlsCredentials] = {}
_loaded_lock = threading.Lock()


def skein_container_credentials() -> TlsCredentials | None:
    """In a YARN container started by skein: the application's credentials, which YARN put in
    the container's directory (``.skein.crt``, ``.skein.pem``); else None."""
    if not os.environ.get("SKEIN_APPLICATION_ID"):
        return None
    for folder in (os.environ.get("PWD") or "", os.getcwd()):
        cert, key = os.path.join(folder, ".skein.crt"), os.path.join(folder, ".skein.pem")
        if folder and os.path.exists(cert) and os.path.exists(key):
            return TlsCredentials(cert, key)
    return None


def skein_client_credentials(security: Any) -> TlsCredentials:
    """A skein client's security (what the applications it submits get, so what their
    containers hold) as credentials; ones given as bytes are written to a private folder."""
    cert, key = getattr(security, "cert_file", None), getattr(security, "key_file", None)
    cert_path = getattr(cert, "source", cert)
    key_path = getattr(key, "source", key)
    if isinstance(cert_path, str) and isinstance(key_path, str) and cert_path and key_path:
        return TlsCredentials(cert_path.removeprefix("file://"), key_path.removeprefix("file://"))
    import atexit
    import tempfile

    cert_bytes = security.cert_bytes if isinstance(security.cert_bytes, bytes) else security.cert_bytes.encode()
    known = _FROM_SKEIN.get(cert_bytes)
    if known is not None and os.path.exists(known.key_file):
        return known
    folder = tempfile.mkdtemp(prefix="yarnflow-skein-credentials-")
    atexit.register(shutil.rmtree, folder, True)
    key_bytes = security.key_bytes if isinstance(security.key_bytes, bytes) else security.key_bytes.encode()
    cert_path, key_path = _write_private(folder, [(CERT_FILE, cert_bytes), (KEY_FILE, key_bytes)])
    found = _FROM_SKEIN[cert_bytes] = TlsCredentials(cert_path, key_path)
    return found


_FROM_SKEIN: dict[bytes, TlsCredentials] = {}


def client_credentials(config: Configuration, address: str) -> TlsCredentials | None:
    """What a client uses to reach the cluster at ``address``: the configured credentials, else
    those a local session published for that address, else, in a YARN container (application
    mode's main()), the application's, else (high availability) those in the cluster's storage
    dir (TLS then on whatever the configuration says), else none. Raises
    ConfigurationError when the configuration turns TLS on and none are found."""
    from yarnflow.common.ha import ha_enabled

    if config[Options.SSL_INTERNAL_CERT] or config[Options.SSL_INTERNAL_KEY]:
        return internal_credentials(config.with_overrides({Options.SSL_INTERNAL.key: "true"}), address)
    folder = published_folder(address)
    if address and os.path.exists(os.path.join(folder, CERT_FILE)):
        if _owner_alive(folder):
            return TlsCredentials(os.path.join(folder, CERT_FILE), os.path.join(folder, KEY_FILE))
        log.info("ignoring the credentials in %s: the session that left them is gone", folder)
        shutil.rmtree(folder, ignore_errors=True)
    found = skein_container_credentials()  # a job's main() in its application's AppMaster container
    if found is None and ha_enabled(config):
        found = _from_storage(config)
    if found is None and config[Options.SSL_INTERNAL]:
        return internal_credentials(config, address)  # (raises, naming where they were looked for)
    return found


def rest_token(credentials: TlsCredentials) -> str:
    """The cluster's REST token: derived from its private key, so every AppMaster of the
    cluster and every client holding its credentials knows it without it being stored or sent
    anywhere (and it changes with the credentials)."""
    digest = hmac.new(credentials.key_pem, b"yarnflow REST token v1", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def token_in_header(header: str) -> str:
    """The token an ``Authorization`` header carries: ``Bearer TOKEN``, or HTTP basic with the
    token as the password (``curl -u yarnflow:TOKEN``); "" for none or a malformed one."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            return ""
    return ""


def token_matches(presented: str, token: str) -> bool:
    """``presented`` is ``token`` (compared in constant time; "" never matches)."""
    return bool(presented) and hmac.compare_digest(presented.encode("utf-8", "replace"), token.encode("utf-8"))


def rest_auth_token(config: Configuration, credentials: TlsCredentials | None) -> str:
    """The token requests must carry, or "" when the REST API is open (``rest.authentication``:
    none, or auto without the cluster's credentials). Raises ConfigurationError for token
    without them (the token is derived from them)."""
    mode = config[Options.REST_AUTH]
    if mode == "none" or (mode == "auto" and credentials is None):
        return ""
    if credentials is None:
        raise ConfigurationError(f"{Options.REST_AUTH.key}: token needs the cluster's credentials: set "
                                 f"{Options.SSL_INTERNAL.key} (the token is derived from them)")
    return rest_token(credentials)


@dataclass(frozen=True)
class RestAccess:
    """How a client holding the cluster's credentials calls its REST API: the token header and,
    for HTTPS, a context that trusts the cluster's certificate as well as the usual ones (the
    cluster's names no host: host names are not checked)."""

    headers: dict[str, str]
    context: ssl.SSLContext | None

    @classmethod
    def of(cls, credentials: TlsCredentials | None) -> RestAccess:
        if credentials is None:
            return cls({}, None)
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata=credentials.cert_pem.decode("ascii"))
        ctx.check_hostname = False
        return cls({"Authorization": f"Bearer {rest_token(credentials)}"}, ctx)


class HandshakeLog:
    """Refused handshakes, logged once per peer host (a scanner or a misconfigured client must
    not flood the log): the first at WARNING, later ones counted at DEBUG."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def refused(self, peer: str, why: BaseException) -> None:
        host = peer.rsplit(":", 1)[0]
        with self._lock:
            n = self._seen[host] = self._seen.get(host, 0) + 1
        if n == 1:
            log.warning("%s: refused a connection from %s without the cluster's certificate (%s); further ones "
                        "from that host are logged at DEBUG", self._name, peer, _reason(why))
        else:
            log.debug("%s: refused connection %d from %s: %s", self._name, n, peer, _reason(why))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.__class__.__name__
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no handshake in time"
    return str(exc) or exc.__class__.__name__


def server_handshake(connection: Any, credentials: TlsCredentials) -> None:
    """Wrap an accepted connection (a Thrift ``TSocket``: its ``handle`` becomes the TLS socket
    at once, so a server that stops can shut it down mid-handshake) and complete the TLS
    handshake, on the connection's own thread, with a deadline: a silent peer holds only its
    thread. Raises on failure."""
    sock: socket.socket = connection.handle
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    started = time.monotonic()
    wrapped = credentials.server_context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    connection.handle = wrapped
    try:
        wrapped.do_handshake()
    except BaseException:
        wrapped.close()  # (it owns the connection's file descriptor now)
        raise
    wrapped.settimeout(None)
    log.debug("TLS handshake in %.1f ms", (time.monotonic() - started) * 1000)
