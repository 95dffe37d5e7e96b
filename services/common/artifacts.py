"""The artifact store: immutable files addressed by a URI (``file://`` in embedded mode).

Datasets, checkpoints and harness archives are written once under ``<data_dir>/artifacts`` and read by path; an
S3-compatible backend can implement the same functions. The directories the store creates are writable by their
group as well as their owner: the processes sharing a store may be different users of one group (docker-compose runs
the services as uid 10001 of group 0 and the eval worker, which starts sandbox containers, as root).
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


def _make_parents(path: Path) -> None:
    """Create the missing directories above ``path``, each writable by its group (see the module docstring)."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    for directory in missing:
        try:
            directory.chmod(0o775)
        except PermissionError:
            pass  # another process of the store made it first: its mode is its maker's


def dataset_key(sha256: str) -> str:
    """Where an uploaded dataset's bytes live in the store: content-addressed by their SHA-256 (hex), so the trainer
    that writes them and the grader that audits them agree on the place without asking each other."""
    return f"datasets/{sha256}.jsonl"


def get_bytes(root: Path, key: str) -> bytes:
    """The bytes stored at ``root/key``; raises ``FileNotFoundError`` if nothing is."""
    return (root / key).read_bytes()


def put_bytes(root: Path, key: str, data: bytes) -> str:
    """Write ``data`` at ``root/key`` atomically (if absent) and return its URI."""
    path = (root / key).resolve()
    if not path.exists():
        _make_parents(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path.as_uri()


def put_dir(root: Path, key: str, src: Path) -> str:
    """Copy the folder ``src`` to ``root/key`` (replacing a partial copy) and return its URI."""
    dest = (root / key).resolve()
    if dest.exists():
        shutil.rmtree(dest)
    _make_parents(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp)
    tmp.replace(dest)
    return dest.as_uri()
