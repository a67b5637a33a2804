"""Job artifacts uploaded through the AppMaster (Flink's BlobServer): ``POST /artifacts``.

A client that cannot write the cluster's storage dir itself (a laptop behind a gateway, a CI
runner without HDFS access) streams the artifact to the AppMaster's REST API instead; it then
needs network access to the AppMaster only. The upload is read in chunks (never whole in
memory), at most ``rest.server.max-content-length`` bytes, hashed as it arrives and checked
against the sha256 the client names, written to a temporary file and renamed into place under
``<storage dir>/artifacts/<sha256>.zip``, where every TaskExecutor reads it as before."""

from __future__ import annotations

import hashlib
import logging
import uuid
from typing import IO

import fsspec

from yarnflow.common.artifacts import artifact_uri

__all__ = ["UploadError", "receive_artifact"]

log = logging.getLogger(__name__)
CHUNK = 1 << 20


class UploadError(Exception):
    """A refused upload: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def receive_artifact(stream: IO[bytes], length: int | None, sha256: str, storage_dir: str,
                     max_bytes: int) -> tuple[str, str, int]:
    """Store the artifact read from ``stream`` (``length`` bytes when known); returns its URI,
    its sha256 and its size. Raises UploadError: 411 without a length, 413 when over
    ``max_bytes``, 400 when it is empty or its content does not have the sha256 named."""
    if length is None:
        raise UploadError(411, "an artifact upload needs a Content-Length")
    if length > max_bytes:
        raise UploadError(413, f"the artifact ({length} bytes) is over rest.server.max-content-length "
                               f"({max_bytes} bytes)")
    if length == 0:
        raise UploadError(400, "the upload is empty: send the artifact (a zip) as the body")
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise UploadError(400, "name the artifact's sha256 (64 lowercase hex digits): ?sha256=...")
    final = artifact_uri(storage_dir, sha256)
    fs, path = fsspec.core.url_to_fs(final)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.upload"
    digest, size = hashlib.sha256(), 0
    try:
        with fs.open(tmp, "wb") as out:
            while size < length:
                chunk = stream.read(min(CHUNK, length - size))
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if size != length:
            raise UploadError(400, f"the upload ended after {size} of {length} bytes")
        if digest.hexdigest() != sha256:
            raise UploadError(400, f"the artifact's sha256 is {digest.hexdigest()}, not {sha256} as named: "
                                   "it was corrupted on the way")
        if fs.exists(path):  # stored once per content
            fs.rm(tmp)
        else:
            fs.mv(tmp, path)
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise
    log.info("received job artifact %s (%d bytes) through the AppMaster", final, size)
    return final, sha256, size
