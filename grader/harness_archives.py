"""Code harnesses: archives a run uploads (``POST /v1/harnesses``), validated, content-addressed and immutable, as
datasets are; and the suites' own default harness folders, packed the same way.

An archive is a ``.tar.gz`` (at most :data:`MAX_ARCHIVE_BYTES` compressed, :data:`MAX_UNPACKED_BYTES` unpacked,
:data:`MAX_MEMBERS` members) of plain files and directories, with a manifest ``harness.toml`` at its root::

    name = "terminal-agent"                 # 1-100 characters
    entry = "python3 /harness/agent.py"     # run with `bash -c` in the task's working directory (/app)
    install = "bash /harness/install.sh"    # optional; run first, in the same sandbox, before the entry
    [limits]                                # optional; each capped by the benchmark's (see `Limits`)
    wall_s = 300
    memory_mb = 1024
    processes = 64
    disk_mb = 256

The rollout unpacks it at ``/harness`` (writable, the rollout's own copy), gives the entry the task's instruction on
stdin and ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` in its environment (:mod:`grader.rollouts`).

Refused with a 422 naming the member (``field: "file"``, ``member``): absolute paths, ``..``, links pointing out of
the tree (or anywhere, for hard links), device files, FIFOs, setuid or setgid files, names that are not UTF-8 or hold
control characters, paths deeper than :data:`MAX_DEPTH`, more than the limits, a second manifest; and a missing or
invalid manifest (``field: "harness.toml"`` and the key; values are not coerced: ``wall_s = "10"`` is refused). The
``tarfile.data_filter`` of PEP 706 decides what is unsafe (``backports.tarfile``, CPython 3.12's tarfile: Debian's Python
3.11.2, the compose images' base, predates the filters); this module adds the limits and the manifest. The limits
hold while an archive is read, not only by what its headers declare: the decompressed stream is counted as it is read
(:func:`services.common.untrusted.open_tar`: a header of megabytes stops there), and a rollout unpacks it with the
same caps (:func:`unpack`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tomllib
from pathlib import Path, PurePosixPath

from backports import tarfile  # the PEP 706 filters on every Python 3.11 (Debian's 3.11.2 has none)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grader import repository
from grader.models import PLATFORM_RUN, HarnessArchive
from grader.service import Grader
from grader.suites import Suite
from services.common import artifacts, untrusted
from services.common.auth import RunContext
from services.common.contracts import Harness, HarnessArchiveOut
from services.common.errors import PayloadTooLarge, Unprocessable

MAX_ARCHIVE_BYTES = 16 * 1024 * 1024
MAX_UNPACKED_BYTES = 64 * 1024 * 1024
MAX_MEMBERS = 2000
MAX_DEPTH = 32  # directories in a member's path
MAX_NAME_CHARS = 1024
MANIFEST = "harness.toml"


class HarnessLimits(BaseModel):
    """Limits a harness declares for its rollouts; each is capped by the platform's, and ``None`` takes the cap."""

    model_config = ConfigDict(extra="forbid", strict=True)

    wall_s: float | None = Field(None, gt=0, le=3600, description="Seconds a rollout may run.")
    memory_mb: int | None = Field(None, ge=64, le=16384, description="MiB of memory.")
    processes: int | None = Field(None, ge=4, le=1024, description="Processes and threads alive at once.")
    disk_mb: int | None = Field(None, ge=16, le=4096, description="MiB the working directory may hold.")


class HarnessManifest(BaseModel):
    """``harness.toml`` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")
    entry: str = Field(min_length=1, max_length=2000, pattern=r"^[^\x00]+$", description="Command line, run with `bash -c` in /app; the instruction on stdin.")
    install: str | None = Field(None, min_length=1, max_length=2000, pattern=r"^[^\x00]+$",
                                description="Command line run before the entry, in the same sandbox.")
    limits: HarnessLimits = Field(default_factory=HarnessLimits)


def _refuse(detail: str, member: str | None = None) -> Unprocessable:
    return Unprocessable(detail, field="file", member=member)


def inspect_archive(data: bytes) -> HarnessManifest:
    """Validate ``data`` as a harness archive (see the module docstring) and return its manifest. Raises
    ``PayloadTooLarge`` past :data:`MAX_ARCHIVE_BYTES`, ``Unprocessable`` naming the member or manifest key."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise PayloadTooLarge(f"a harness archive is at most {MAX_ARCHIVE_BYTES} bytes; this one is {len(data)}", field="file")
    if data[:2] != b"\x1f\x8b":
        raise _refuse("not a gzip-compressed tar archive")
    manifest: bytes | None = None
    total, count = 0, 0
    try:
        with untrusted.open_tar(data, max_stream_bytes=untrusted.stream_cap(MAX_UNPACKED_BYTES, MAX_MEMBERS)) as tar:
            for member in tar:
                count += 1
                if count > MAX_MEMBERS:
                    raise _refuse(f"more than {MAX_MEMBERS} members")
                name = member.name
                try:
                    name.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise _refuse("a member's name is not UTF-8", name.encode("utf-8", "replace").decode()) from exc
                if any(ord(c) < 32 or ord(c) == 127 for c in name):
                    raise _refuse("a member's name holds a control character (a newline, a tab …)", name.encode("unicode_escape").decode())
                if len(PurePosixPath(name).parts) > MAX_DEPTH or len(name) > MAX_NAME_CHARS:
                    raise _refuse(f"a member's path is deeper than {MAX_DEPTH} directories or longer than {MAX_NAME_CHARS} characters", name[:200])
                if member.mode & 0o6000:
                    raise _refuse("setuid and setgid files are not allowed", name)
                if name.startswith("/") or PurePosixPath(name).is_absolute():
                    raise _refuse("unsafe member: an absolute path", name)
                if ".." in PurePosixPath(name).parts:
                    raise _refuse("unsafe member: a path through '..'", name)
                if member.islnk():
                    raise _refuse("hard links are not allowed", name)
                try:
                    tarfile.data_filter(member, "/harness")
                except tarfile.FilterError as exc:
                    raise _refuse(f"unsafe member: {exc}", name) from exc
                if not (member.isfile() or member.isdir() or member.issym()):
                    raise _refuse("only files, directories and links inside the tree are allowed", name)
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise _refuse(f"more than {MAX_UNPACKED_BYTES} bytes unpacked", name)
                if member.isfile() and PurePosixPath(name) == PurePosixPath(MANIFEST):
                    if manifest is not None:
                        raise _refuse(f"the archive holds {MANIFEST} twice", name)
                    manifest = tar.extractfile(member).read()  # type: ignore[union-attr]
    except untrusted.UnsafeArchive as exc:
        raise _refuse(f"more than {MAX_UNPACKED_BYTES} bytes unpacked ({exc.detail})") from exc
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _refuse(f"the archive is damaged: {exc}") from exc
    if manifest is None:
        raise Unprocessable(f"the archive has no {MANIFEST} at its root", field=MANIFEST)
    return parse_manifest(manifest)


def parse_manifest(text: bytes) -> HarnessManifest:
    """The manifest in ``text``; ``Unprocessable`` naming ``harness.toml`` and the faulty key."""
    try:
        raw = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise Unprocessable(f"{MANIFEST} is not TOML: {exc}", field=MANIFEST) from exc
    try:
        return HarnessManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise Unprocessable(f"{MANIFEST}: {key}: {first['msg']}", field=f"{MANIFEST}.{key}" if key else MANIFEST) from exc


def pack_folder(folder: Path) -> bytes:
    """A deterministic ``.tar.gz`` of ``folder``'s files (sorted names, zeroed times and owners), so the same folder
    always packs to the same bytes, hence the same content address."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(folder).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def _out(row: HarnessArchive) -> HarnessArchiveOut:
    return HarnessArchiveOut(id=row.id, name=row.name, sha256=row.sha256, bytes=row.bytes, entry=row.manifest["entry"],
                             install=row.manifest.get("install"), platform=row.run_id == PLATFORM_RUN, created_at=row.created_at)  # type: ignore[arg-type]


def store_archive(grader: Grader, run_id: str, data: bytes, *, name: str | None = None) -> HarnessArchiveOut:
    """Validate and store ``data`` for ``run_id`` (:data:`grader.models.PLATFORM_RUN` for a suite's own); the same
    bytes stored twice for a run return the first record. Raises as :func:`inspect_archive`."""
    manifest = inspect_archive(data)
    digest = hashlib.sha256(data).hexdigest()
    uri = artifacts.put_bytes(grader.settings.artifacts_dir, f"harnesses/{digest}.tar.gz", data)
    with grader.db.session() as s:
        existing = repository.run_archive_by_digest(s, run_id, digest)
        if existing is not None:
            return _out(existing)
        return _out(repository.add_archive(s, run_id, name=name or manifest.name, sha256=digest, size=len(data), uri=uri,
                                           manifest=manifest.model_dump(mode="json")))


def owned_archive(grader: Grader, ctx: RunContext | None, harness_id: str) -> HarnessArchive:
    """The archive ``harness_id`` if ``ctx``'s run may use it (its own, or a suite's; a baseline, ``ctx=None``, only a
    suite's); ``NotFound`` (field ``harness_archive``) otherwise."""
    with grader.db.session() as s:
        return repository.usable_archive(s, ctx, harness_id)


def get_archive(grader: Grader, ctx: RunContext, harness_id: str) -> HarnessArchiveOut:
    """The wire form of an archive the run may use (as :func:`owned_archive`)."""
    return _out(owned_archive(grader, ctx, harness_id))


def archive_bytes(grader: Grader, ctx: RunContext | None, harness_id: str) -> bytes:
    """The stored ``.tar.gz`` of an archive the run may use (as :func:`owned_archive`)."""
    return artifacts.local_path(owned_archive(grader, ctx, harness_id).uri).read_bytes()


def list_archives(grader: Grader, ctx: RunContext) -> list[HarnessArchiveOut]:
    """The run's archives, oldest first, then the suites' own."""
    with grader.db.session() as s:
        return sorted((_out(r) for r in repository.usable_archives(s, ctx.run_id)), key=lambda a: a.platform)


def unpack(data: bytes, dest: Path) -> None:
    """Unpack a validated archive into ``dest`` with ``tarfile``'s ``data`` filter (PEP 706) and the module's caps
    (:func:`services.common.untrusted.unpack_tar`; raises its ``UnsafeArchive`` past them)."""
    untrusted.unpack_tar(data, dest, max_bytes=MAX_UNPACKED_BYTES, max_files=MAX_MEMBERS, what="the harness archive")


_DEFAULTS: dict[str, str] = {}  # suite name -> its default harness archive's id, stored once per process


def default_archive(grader: Grader, suite: Suite) -> str | None:
    """The id of ``suite``'s own code harness (its ``default_harness_folder``, packed and stored as a platform archive
    on first use); ``None`` for a suite without one."""
    folder = getattr(suite, "default_harness_folder", None)
    if folder is None:
        return None
    if suite.name not in _DEFAULTS:
        _DEFAULTS[suite.name] = store_archive(grader, PLATFORM_RUN, pack_folder(folder)).id
    return _DEFAULTS[suite.name]


def code_harness_for(grader: Grader, ctx: RunContext | None, suite: Suite, harness: Harness | None, harness_archive: str | None) -> str | None:
    """The code harness a system runs with: ``harness_archive`` if given (``NotFound`` unless ``ctx``'s run may use it);
    else, with no declarative ``harness``, the suite's own code harness if it has one; else ``None`` (a declarative
    harness). Raises ``Unprocessable`` (field ``harness``) for a declarative harness on a suite of sandboxed tasks."""
    if harness_archive is not None:
        owned_archive(grader, ctx, harness_archive)
        return harness_archive
    default = default_archive(grader, suite)
    if default is not None and harness is not None:
        raise Unprocessable(f"the {suite.name} suite's tasks are run by a code harness: give harness_archive (its own is {default}), "
                            "not a declarative harness", field="harness")
    return default if harness is None else None
