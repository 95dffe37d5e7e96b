"""Uploads are data: the one way a service runs git on, or unpacks, content it did not write (an operator's task
upload, a run's harness archive, a stored task folder).

- :func:`git` runs git with no configuration but its own: no system or global file (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``), ``HOME`` and ``XDG_CONFIG_HOME`` an empty folder of the call (removed when it ends), a clean
  environment (nothing of the caller's ``GIT_*``), no repository discovery above the working folder
  (``GIT_CEILING_DIRECTORIES``), hooks, fsmonitor, attribute and exclude files off, no transport at all
  (``protocol.allow=never``) and no automatic gc. A repository it works in is one it made (``init``), whose
  ``.git/config`` is its own: so a ``.gitconfig`` of the tree, a filter driver a ``.gitattributes`` line names, hooks or
  an ``includeIf`` have nothing to be read from. :func:`strip_git` removes every ``.git`` of a tree before git touches
  it (an uploaded repository's own metadata, a ``.git`` file pointing elsewhere).
- :func:`unpack_tar` unpacks a ``.tar`` or ``.tar.gz`` with ``tarfile``'s ``data`` filter (PEP 706: no absolute paths,
  ``..``, links leading out of the tree, device files) and caps on what it unpacks, not only on what it is packed:
  the decompressed stream is counted as it is read (a gzip bomb, a huge header, stops there), every member's size and
  the count of members are checked before it is written. :func:`open_tar` gives the capped stream to a reader that
  only inspects.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from backports import tarfile  # the PEP 706 filters on every Python 3.11 (Debian's 3.11.2 has none)

GIT_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "core.attributesFile=/dev/null",
               "-c", "core.excludesFile=/dev/null", "-c", "protocol.allow=never", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
               "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", "-c", "user.name=crucible", "-c", "user.email=git@crucible.invalid")
"""What every :func:`git` call is given on its command line (over any file's configuration)."""
HEADER_BYTES = 4096
"""Bytes of tar headers allowed per member, beyond its data, in the decompressed stream (its header, a long name's,
a PAX header, padding)."""


class UnsafeArchive(ValueError):
    """An archive :func:`unpack_tar` refuses: ``detail``, the ``member`` at fault (or ``None``), and whether it is
    refused for its size (``too_large``: more bytes or members than allowed) rather than its content."""

    def __init__(self, detail: str, *, member: str | None = None, too_large: bool = False) -> None:
        super().__init__(detail)
        self.detail, self.member, self.too_large = detail, member, too_large


def git(args: list[str], cwd: Path, *, stdin: str | bytes | None = None, env: dict[str, str] | None = None,
        text: bool = True, check: bool = False) -> subprocess.CompletedProcess:
    """Run ``git <args>`` in ``cwd`` as the module docstring says (output captured; ``text``: decoded as UTF-8 with
    replacement). ``env``: more variables (an author's date). Raises ``subprocess.CalledProcessError`` on a non-zero
    exit when ``check``."""
    with tempfile.TemporaryDirectory(prefix="crucible-git-home-") as home:  # empty, this call's alone, gone when it ends
        return _git(args, cwd, home, stdin=stdin, env=env, text=text, check=check)


def _git(args: list[str], cwd: Path, home: str, *, stdin: str | bytes | None, env: dict[str, str] | None, text: bool,
         check: bool) -> subprocess.CompletedProcess:
    variables = {"PATH": "/usr/bin:/bin", "HOME": home, "XDG_CONFIG_HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
                 "GIT_ATTR_NOSYSTEM": "1", "GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent), "GIT_TERMINAL_PROMPT": "0",
                 "GIT_NO_REPLACE_OBJECTS": "1", "LC_ALL": "C", **(env or {})}
    if text and isinstance(stdin, str):
        stdin = stdin.encode()
    done = subprocess.run(["git", *GIT_OPTIONS, *args], cwd=cwd, env=variables, input=stdin, capture_output=True, check=check)
    if text:
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"))
    return done


def strip_git(folder: Path) -> None:
    """Remove every ``.git`` (a folder, a file, a link) anywhere in ``folder``."""
    for parent, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            if name == ".git":
                path = Path(parent) / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        dirs[:] = [d for d in dirs if d != ".git"]


def stream_cap(max_bytes: int, max_files: int) -> int:
    """The most bytes a tar stream of at most ``max_files`` members and ``max_bytes`` of data may decompress to."""
    return max_bytes + HEADER_BYTES * (max_files + 2) + 20 * 512


class _Capped(io.RawIOBase):
    """A readable, seekable view of ``inner`` that raises :class:`UnsafeArchive` once a read or seek reaches past
    ``cap`` bytes."""

    def __init__(self, inner: io.BufferedIOBase | gzip.GzipFile, cap: int, what: str) -> None:
        super().__init__()
        self.inner, self.cap, self.what = inner, cap, what

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _check(self, position: int) -> int:
        if position > self.cap:
            raise UnsafeArchive(f"{self.what} decompresses to more than {self.cap} bytes", too_large=True)
        return position

    def read(self, size: int = -1) -> bytes:
        wanted = self.cap + 1 - self.inner.tell() if size is None or size < 0 else size
        data = self.inner.read(max(0, wanted))
        self._check(self.inner.tell())
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._check(offset)
        return self._check(self.inner.seek(offset, whence))

    def tell(self) -> int:
        return self.inner.tell()


@contextmanager
def open_tar(source: bytes | Path, *, max_stream_bytes: int, what: str = "the archive") -> Iterator[tarfile.TarFile]:
    """``source`` (bytes or a file's path; gzip-compressed or not, told by its first bytes) opened for reading, whose
    decompressed stream raises :class:`UnsafeArchive` past ``max_stream_bytes``. ``tarfile.TarError``, ``OSError`` and
    ``EOFError`` for a damaged archive, as ``tarfile`` raises them."""
    raw = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115 - closed below
    try:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        inner = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        with tarfile.open(fileobj=_Capped(inner, max_stream_bytes, what), mode="r:") as tar:  # type: ignore[arg-type]
            yield tar
    except zlib.error as exc:
        raise tarfile.ReadError(f"{what} is not a readable gzip stream: {exc}") from exc
    finally:
        raw.close()


def unpack_tar(source: bytes | Path, dest: Path, *, max_bytes: int, max_files: int, what: str = "the archive",
               skip_unsafe: bool = False, drop_git: bool = False) -> list[tuple[str, str]]:
    """Unpack ``source`` (bytes or a file's path, ``.tar`` or ``.tar.gz``) into ``dest`` (module docstring): at most
    ``max_bytes`` of file data (each member's declared size, a sparse file's full length, counted before it is
    written) and ``max_files`` members. ``drop_git``: leave out every member with a ``.git`` in its path. An unsafe
    member (``tarfile.data_filter`` refuses it) raises, or is left out with ``skip_unsafe``. Returns the members left
    out as unsafe, ``(name, why)``. Raises :class:`UnsafeArchive` (``too_large`` for the caps; ``what`` names the
    archive in its detail) and, for a damaged archive, what :func:`open_tar` raises."""
    dest.mkdir(parents=True, exist_ok=True)
    skipped: list[tuple[str, str]] = []
    written: set[str] = set()
    total, count = 0, 0
    with open_tar(source, max_stream_bytes=stream_cap(max_bytes, max_files), what=what) as tar:
        for member in tar:
            count += 1
            if count > max_files:
                raise UnsafeArchive(f"{what} holds more than {max_files} files and folders", member=member.name, too_large=True)
            if drop_git and ".git" in PurePosixPath(member.name).parts:
                continue
            try:
                safe = tarfile.data_filter(member, str(dest))
                if member.islnk() and os.path.normpath(member.linkname) not in written:
                    raise tarfile.FilterError(f"{member.name!r} is a hard link to {member.linkname!r}, which is not unpacked before it")
            except tarfile.FilterError as exc:
                if not skip_unsafe:
                    raise UnsafeArchive(f"{what} holds an unsafe member: {exc}", member=member.name) from exc
                skipped.append((member.name, str(exc)))
                continue
            if safe is None:
                continue
            if member.isreg():
                total += member.size
                if total > max_bytes:
                    raise UnsafeArchive(f"{what} unpacks to more than {max_bytes} bytes", member=member.name, too_large=True)
            tar.extract(member, dest, filter="data")
            written.add(os.path.normpath(member.name))
    return skipped


def tree_size(folder: Path) -> tuple[int, int]:
    """``(bytes of its regular files, files, folders and links)`` under ``folder`` (links not followed)."""
    total, count = 0, 0
    for parent, dirs, files in os.walk(folder):
        count += len(dirs) + len(files)
        for name in files:
            info = os.lstat(os.path.join(parent, name))
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total, count


def links_out(folder: Path) -> list[str]:
    """The links under ``folder`` (its relative paths) that are absolute or lead out of it."""
    root = folder.resolve()
    out = []
    for parent, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(parent) / name
            if path.is_symlink():
                target = os.readlink(path)
                try:
                    inside = not os.path.isabs(target) and (path.parent.resolve() / target).resolve().is_relative_to(root)
                except (OSError, RuntimeError):  # a loop of links
                    inside = False
                if not inside:
                    out.append(path.relative_to(folder).as_posix())
    return sorted(out)
