"""Files' content digests, kept while a file's status is unchanged: what model control's poll
compares (`Loader.folder_digest`) and a model's fingerprint reads (`loading.fingerprint`)."""

from __future__ import annotations

import hashlib
from pathlib import Path


class Digests:
    """Files' content digests, each read again only once its status changed."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[tuple[int, int, int, int], str]] = {}

    def of(self, path: Path) -> str:
        stat = path.stat()
        status = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
        known = self._known.get(path)
        if known is not None and known[0] == status:
            return known[1]
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(2**20):
                digest.update(chunk)
        self._known[path] = (status, digest.hexdigest())
        return self._known[path][1]
