"""The artifact store: immutable files addressed by a URI (``file://`` in embedded mode).

Datasets and checkpoints are written once under ``<data_dir>/artifacts`` and read by path; an S3-compatible
backend can implement the same three functions.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse


def local_path(uri: str) -> Path:
    """The filesystem path of a ``file://`` artifact URI; raises ``ValueError`` for other schemes."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise ValueError(f"unsupported artifact URI scheme: {parsed.scheme!r}")
    return Path(parsed.path)


def put_bytes(root: Path, key: str, data: bytes) -> str:
    """Write ``data`` at ``root/key`` atomically (if absent) and return its URI."""
    path = (root / key).resolve()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path.as_uri()


def put_dir(root: Path, key: str, src: Path) -> str:
    """Copy the folder ``src`` to ``root/key`` (replacing a partial copy) and return its URI."""
    dest = (root / key).resolve()
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    tmp.replace(dest)
    return dest.as_uri()
