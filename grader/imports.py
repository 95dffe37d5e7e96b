"""Importing an operator's own tasks (``crucible admin import-tasks``), so a hidden test split can be one no repository
holds: stored in the grader's test store, validated in the sandbox, drawn from by ``suite.splits.test.collection``.

An upload is a ``.tar.gz`` of one folder, read as the suite's format:

- **terminal**: Harbor task folders (Terminal-Bench's form), the folder itself or each of its sub-folders holding a
  ``task.toml``: ``instruction.md``, ``tests/test.sh`` (writes ``/logs/verifier/reward.txt``), ``solution/solve.sh``
  (the oracle), optional ``environment/app/`` and ``environment/setup.sh``. An ``environment/Dockerfile`` is not built:
  every task runs in the sandbox image, so its set-up belongs in ``setup.sh``.
- **swe**: SWE-bench instances, ``instances.jsonl`` (one JSON object a line: ``instance_id``, ``repo``, ``base_commit``,
  ``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``: lists of pytest node ids, or
  SWE-bench's JSON strings of them; optional ``python_path``, the folder put on ``PYTHONPATH``, default ``.``) and
  ``repos/``, for each ``repo`` (``/`` written ``__``) a git repository folder holding ``base_commit``, or an sdist
  ``.tar.gz`` whose one top folder is the tree at the base commit. Each instance becomes a Harbor folder of the swe
  suite's form (:mod:`grader.suites.swe`): ``/app`` the tree at the base commit as a one-commit repository, the
  verifier the suite's (the harness's non-test ``.py`` changes laid over the pristine tree with ``test_patch`` applied,
  the selected tests run as the agent user with pytest from ``/opt/swe-env``, which holds pytest and nothing else: a
  project needing other packages is refused), and the oracle ``git apply`` of ``patch``.

**Validation** (on an eval worker, :func:`validate_collection`): a task is **accepted** when its oracle
(``solution/``, run as a code harness: ``bash /harness/solve.sh`` in ``/app``) gets reward 1 and a harness that does
nothing gets 0; otherwise **refused**, with why (the verifier's output tail). A task that cannot be read is refused
at upload. Only accepted tasks are drawn; a task's files never leave the grader.

**An upload is data** (:mod:`services.common.untrusted`): nothing it holds is executed or read as configuration on
the grader host; only the sandbox runs its scripts. git runs through :func:`services.common.untrusted.git` alone (no
system or global configuration, ``HOME`` outside the upload, hooks, fsmonitor and attribute files off), in
repositories this module makes: an uploaded repository gives only its objects (copied, without alternates, into a
new bare repository), and every ``.git`` of a tree it commits or patches is removed first (an sdist's own). Every
archive (the upload, an sdist, ``git archive``'s output, a stored task at :func:`~grader.suites.base.imported_environment`)
is unpacked by :func:`services.common.untrusted.unpack_tar`: the ``data`` filter, and caps on what it unpacks to
(:data:`MAX_UNPACKED_BYTES` and :data:`MAX_UPLOAD_FILES` for the upload, a 413 naming ``file``;
:data:`~grader.suites.base.IMPORTED_TASK_MAX_BYTES` and :data:`~grader.suites.base.IMPORTED_TASK_MAX_FILES` for a
task). **One bad task is refused alone**, with its reason: an unsafe member of the upload under it, a link that is
absolute or leads out of its folder (committed, or made by ``test_patch``), a tree past the caps, an instance that
cannot be built, a validation that raises or that has stopped its worker :data:`MAX_VALIDATION_ATTEMPTS` times; so
every collection reaches ``done``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog
from backports import tarfile  # the PEP 706 filters on every Python 3.11 (Debian's 3.11.2 has none)

from grader.harness_archives import inspect_archive, pack_folder
from grader.model_endpoint import Binding, ModelEndpoint
from grader.rollouts import RolloutLimits, TaskSetupFailed, run_rollout
from grader.sandboxes import Sandbox
from grader.service import Grader
from grader.suites import Item, base, swe
from grader.suites.base import imported_environment
from grader.suites.swe_mutants import ENV_TARGET, SWE_DIR
from services.common import untrusted
from services.common.contracts import IMPORTED_TASK_NAME, ImportedTaskOut, TaskCollectionOut
from services.common.errors import Conflict, NotFound, PayloadTooLarge, Unprocessable
from services.common.untrusted import UnsafeArchive, links_out, tree_size, unpack_tar

log = structlog.get_logger("grader")

MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
"""An upload's files, unpacked, at most (bytes)."""
MAX_UPLOAD_FILES = 200_000
"""An upload's files, folders and links, unpacked, at most."""
MAX_TASK_BYTES = 16 * 1024 * 1024
"""One task's Harbor folder, packed (``.tar.gz`` bytes), at most; unpacked, see
:data:`~grader.suites.base.IMPORTED_TASK_MAX_BYTES` and :data:`~grader.suites.base.IMPORTED_TASK_MAX_FILES`."""
MAX_VALIDATION_ATTEMPTS = 2
"""Times a task's validation may start without reaching a verdict (its worker died) before the task is refused."""
NOOP_HARNESS = b'name = "noop"\nentry = "true"\n'


def import_collection(grader: Grader, name: str, suite: str, data: bytes) -> TaskCollectionOut:
    """Read the upload ``data`` (a ``.tar.gz``, module docstring) as ``suite``'s tasks, store them as collection
    ``name`` (unreadable ones refused at once) and queue their validation. Raises ``Unprocessable`` (field ``file``) for
    an archive that is not one, or that holds no task of the suite; ``PayloadTooLarge`` (field ``file``) past
    :data:`MAX_UNPACKED_BYTES` or :data:`MAX_UPLOAD_FILES`; ``Conflict`` (field ``name``) when the collection exists."""
    if suite not in ("terminal", "swe"):
        raise Unprocessable(f"tasks are imported for the terminal or swe suite, not {suite!r}", field="suite")
    with tempfile.TemporaryDirectory(prefix="crucible-import-") as tmp:
        upload = _Upload.unpack(data, Path(tmp) / "upload")
        read = _swe_tasks(upload, Path(tmp) / "built") if suite == "swe" else _terminal_tasks(upload)
        if not read:
            raise Unprocessable("the archive holds no instances.jsonl" if suite == "swe" else "the archive holds no folder with a task.toml",
                                field="file")
        rows = [_row(task_name, instruction, folder_or_reason) for task_name, instruction, folder_or_reason in read]
    if len({r["name"] for r in rows}) < len(rows):
        raise Unprocessable("two tasks of the archive have the same name", field="file")
    if not grader.store.add_collection(name, suite, rows):
        raise Conflict(f"the collection {name!r} exists; import under another name", field="name")
    log.info("tasks imported", collection=name, suite=suite, tasks=len(rows), refused=sum(r["status"] == "refused" for r in rows))
    if any(r["status"] == "pending" for r in rows):
        grader.enqueue_import(name)
    return collection_out(grader, name)


def collection_out(grader: Grader, name: str) -> TaskCollectionOut:
    """The collection and each task's validation status; ``NotFound`` if there is none of that name."""
    rows = grader.store.collection(name)
    if not rows:
        raise NotFound(f"no task collection {name!r}")
    counts = {s: sum(r.status == s for r in rows) for s in ("accepted", "refused", "pending")}
    return TaskCollectionOut(name=name, suite=rows[0].suite, status="validating" if counts["pending"] else "done", **counts,  # type: ignore[arg-type]
                             tasks=[ImportedTaskOut(name=r.name, status=r.status, reason=r.reason) for r in rows],  # type: ignore[arg-type]
                             created_at=rows[0].created_at)


def list_collections(grader: Grader) -> list[TaskCollectionOut]:
    """Every imported collection, by name."""
    return [collection_out(grader, name) for name in grader.store.collections()]


def collection_items(grader: Grader, name: str, suite: str) -> list[Item]:
    """The accepted tasks of collection ``name`` as test items (by name; the entry carries the task's folder, see
    :func:`grader.suites.base.imported_environment`). Raises ``Unprocessable`` (field ``suite.splits.test.collection``)
    for an unknown collection, one of another suite or one still being validated."""
    field = "suite.splits.test.collection"
    rows = grader.store.collection(name, with_archives=True)
    if not rows:
        raise Unprocessable(f"no imported task collection {name!r} (crucible admin import-tasks)", field=field)
    if rows[0].suite != suite:
        raise Unprocessable(f"the collection {name!r} holds {rows[0].suite} tasks, not {suite} tasks", field=field)
    if any(r.status == "pending" for r in rows):
        raise Unprocessable(f"the collection {name!r} is still being validated; load the benchmark once it is done", field=field)
    return [Item(id=r.name, question=r.instruction, answer="",
                 entry={"collection": name, "digest": r.digest, "archive": base64.b64encode(r.archive).decode()})
            for r in rows if r.status == "accepted"]


def validate_collection(grader: Grader, name: str, sandbox: Sandbox, endpoint: ModelEndpoint) -> None:
    """Validate the collection's pending tasks one by one (module docstring), recording each verdict as it comes, so
    every task reaches one: a task whose validation raises is refused with the error; a worker that dies leaves the
    rest pending and the reconciler sends the collection again, and a task whose validation has started
    :data:`MAX_VALIDATION_ATTEMPTS` times without a verdict (it stops its worker) is refused."""
    caps = RolloutLimits.from_settings(grader.settings)
    for row in grader.store.collection(name, with_archives=True):
        if row.status != "pending":
            continue
        started = int(match[1]) if row.reason and (match := _ATTEMPT.fullmatch(row.reason)) else 0
        if started >= MAX_VALIDATION_ATTEMPTS:
            reason: str | None = f"its validation started {started} times and never finished (the worker stopped during it)"
        else:
            grader.store.judge(name, row.name, "pending", f"validating (attempt {started + 1})")
            try:
                reason = validate_task(sandbox, endpoint, row.suite, row.archive, row.instruction, caps)
            except Exception as exc:  # noqa: BLE001 - whatever one task raises is its verdict, never the collection's end
                log.warning("imported task failed to validate", collection=name, task=row.name, exc_info=True)
                reason = f"its validation failed: {type(exc).__name__}: {exc}"[:2000]
        grader.store.judge(name, row.name, "refused" if reason else "accepted", reason)
        log.info("imported task validated", collection=name, task=row.name, accepted=reason is None, reason=reason)


_ATTEMPT = re.compile(r"validating \(attempt (\d+)\)")
"""A pending task's ``reason`` once its validation has started: how many times it has."""


def validate_task(sandbox: Sandbox, endpoint: ModelEndpoint, suite: str, archive: bytes, instruction: str, caps: RolloutLimits) -> str | None:
    """``None`` when the task's oracle resolves it (reward 1) and a harness that does nothing does not (reward 0);
    otherwise why not."""
    digest = hashlib.sha256(archive).hexdigest()
    environment = imported_environment({"archive": base64.b64encode(archive).decode(), "digest": digest},
                                       ((SWE_DIR / "env", ENV_TARGET),) if suite == "swe" else ())
    folder = environment.tests.parent
    with tempfile.TemporaryDirectory(prefix="crucible-import-oracle-") as tmp:
        shutil.copytree(folder / "solution", tmp, dirs_exist_ok=True)
        (Path(tmp) / "harness.toml").write_bytes(b'name = "oracle"\nentry = "bash /harness/solve.sh"\n')
        oracle = pack_folder(Path(tmp))
    noop = _archive({"harness.toml": NOOP_HARNESS})
    for label, harness, wanted in (("its oracle (solution/solve.sh)", oracle, 1.0), ("a harness that does nothing", noop, 0.0)):
        binding = Binding(model="none", ctx=None, hold_id=None, key=f"import:{digest[:16]}:{wanted:.0f}", context_tokens=None, max_tokens=1, max_calls=1)
        try:
            outcome = run_rollout(sandbox, endpoint, archive=harness, archive_id=f"har_import_{label[:5]}", manifest=inspect_archive(harness),
                                  instruction=instruction, binding=binding, environment=environment, caps=caps)
        except TaskSetupFailed as exc:
            return str(exc)
        trajectory = outcome.trajectory
        if trajectory.reward != wanted:
            verifier = trajectory.verifier_run.stdout[-1500:] if trajectory.verifier_run else ""
            harness_err = trajectory.harness_run.stderr[-800:] if trajectory.harness_run else ""
            why = trajectory.failure or f"reward {trajectory.reward:g}, not {wanted:g}"
            docker = " (its environment/Dockerfile is not built: tasks run in the sandbox image)" if (folder / "environment" / "Dockerfile").is_file() else ""
            return f"{label}: {why}{docker}" + (f"\nverifier output:\n{verifier}" if verifier.strip() else "") + (
                f"\nharness stderr:\n{harness_err}" if harness_err.strip() and wanted else "")
    return None


def _archive(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for member, content in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


@dataclass(frozen=True)
class _Upload:
    """The upload unpacked: ``root`` (its single top folder if it has one) and the members left out as unsafe
    (``(path under the unpacked folder, why)``), which refuse the task holding them."""

    dest: Path
    root: Path
    unsafe: tuple[tuple[str, str], ...]

    @classmethod
    def unpack(cls, data: bytes, dest: Path) -> _Upload:
        """``data`` unpacked into ``dest`` (:func:`services.common.untrusted.unpack_tar`: the ``data`` filter, unsafe
        members left out; at most :data:`MAX_UNPACKED_BYTES` and :data:`MAX_UPLOAD_FILES`). Raises ``PayloadTooLarge``
        past the caps and ``Unprocessable`` for what is not a ``.tar.gz``, both naming the field ``file``."""
        try:
            unsafe = unpack_tar(data, dest, max_bytes=MAX_UNPACKED_BYTES, max_files=MAX_UPLOAD_FILES, what="the upload", skip_unsafe=True)
        except UnsafeArchive as exc:
            raise (PayloadTooLarge if exc.too_large else Unprocessable)(exc.detail, field="file", member=exc.member) from exc
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise Unprocessable(f"the file is not a readable .tar.gz: {exc}", field="file") from exc
        entries = list(dest.iterdir()) if dest.is_dir() else []
        return cls(dest, entries[0] if len(entries) == 1 and entries[0].is_dir() else dest, tuple(unsafe))

    def unsafe_in(self, path: Path) -> str | None:
        """Why the task made of ``path`` (a folder or file of the upload) is refused for an unsafe member in it; ``None``
        when it holds none."""
        where = PurePosixPath(path.relative_to(self.dest).as_posix())
        for member, why in self.unsafe:
            if PurePosixPath(member) == where or where in PurePosixPath(member).parents:
                return f"the upload's {member} is unsafe ({why})"
        return None


def _row(name: str, instruction: str, folder_or_reason: Path | str) -> dict[str, Any]:
    reason = folder_or_reason if isinstance(folder_or_reason, str) else None
    archive = b""
    if not re.fullmatch(IMPORTED_TASK_NAME, name):
        reason, name = f"the name {name!r} is not 1-40 of A-Z a-z 0-9 . _ - (starting with a letter or digit)", hashlib.sha256(name.encode()).hexdigest()[:40]
    elif reason is None:
        reason = _folder_refused(folder_or_reason)  # type: ignore[arg-type]
    if reason is None:
        archive = pack_folder(folder_or_reason)  # type: ignore[arg-type]
        if len(archive) > MAX_TASK_BYTES:
            reason, archive = f"the task's folder packs to {len(archive)} bytes; at most {MAX_TASK_BYTES}", b""
    return {"name": name, "instruction": instruction, "digest": hashlib.sha256(archive).hexdigest(), "archive": archive,
            "status": "refused" if reason else "pending", "reason": reason}


def _folder_refused(folder: Path) -> str | None:
    """Why a task's Harbor folder is not stored: a link in it that is absolute or leads out of it (it would not unpack),
    or more than :data:`~grader.suites.base.IMPORTED_TASK_MAX_BYTES` or :data:`~grader.suites.base.IMPORTED_TASK_MAX_FILES`
    unpacked; ``None`` when it is sound."""
    if links := links_out(folder):
        return f"the task's folder holds a link that is absolute or leads out of it: {', '.join(links[:5])}"
    size, files = tree_size(folder)
    if size > base.IMPORTED_TASK_MAX_BYTES or files > base.IMPORTED_TASK_MAX_FILES:
        return (f"the task's folder unpacks to {size} bytes in {files} files and folders: more than {base.IMPORTED_TASK_MAX_BYTES} bytes "
                f"or {base.IMPORTED_TASK_MAX_FILES} files is refused")
    return None


def _terminal_tasks(upload: _Upload) -> list[tuple[str, str, Path | str]]:
    """``(name, instruction, folder or why it cannot be read)`` for each Harbor folder of the upload."""
    root = upload.root
    folders = [root] if (root / "task.toml").is_file() else sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    out: list[tuple[str, str, Path | str]] = []
    for folder in folders:
        if unsafe := upload.unsafe_in(folder):
            out.append((folder.name, "", unsafe))
            continue
        missing = [f for f in ("instruction.md", "tests/test.sh", "solution/solve.sh") if not (folder / f).is_file()]
        instruction = (folder / "instruction.md").read_text(errors="replace") if (folder / "instruction.md").is_file() else ""
        try:
            tomllib.loads((folder / "task.toml").read_text())
        except (UnicodeDecodeError, ValueError) as exc:
            missing.append(f"a task.toml that is TOML ({exc})")
        out.append((folder.name, instruction, f"the folder lacks {', '.join(missing)}" if missing else folder))
    return out


def _swe_tasks(upload: _Upload, built: Path) -> list[tuple[str, str, Path | str]]:
    """``(instance_id, instruction, Harbor folder or why it cannot be built)`` for each line of ``instances.jsonl``."""
    root = upload.root
    if not (root / "instances.jsonl").is_file():
        return []
    out: list[tuple[str, str, Path | str]] = []
    for number, line in enumerate((root / "instances.jsonl").read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            instance = json.loads(line)
            name = str(instance["instance_id"])
        except (ValueError, KeyError, TypeError):
            out.append((f"line-{number}", "", f"line {number} of instances.jsonl is not a JSON object with an instance_id"))
            continue
        try:
            out.append((name, *_swe_folder(upload, instance, built / f"{number}")))
        except _Refused as exc:
            out.append((name, "", str(exc)))
        except Exception as exc:  # noqa: BLE001 - one instance that cannot be built is refused alone
            log.warning("imported instance not built", instance=name, exc_info=True)
            out.append((name, "", f"it could not be built: {type(exc).__name__}: {exc}"[:2000]))
    return out


class _Refused(Exception):
    """Why an instance cannot be built into a task."""


def _tests(instance: dict[str, Any], key: str) -> list[str]:
    value = instance.get(key)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _Refused(f"{key} is neither a list nor a JSON string of one") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and "::" in t for t in value) or (key == "FAIL_TO_PASS" and not value):
        raise _Refused(f"{key} must be a list of pytest node ids (file::test)" + (", at least one" if key == "FAIL_TO_PASS" else ""))
    return value


def _checkout(source: Path, commit: str, scratch: Path, dest: Path) -> None:
    """The tree of ``commit`` of the uploaded repository ``source`` (a working tree holding ``.git/``, or a bare
    repository) into ``dest``. Only its objects are read, copied into a new bare repository of ours (no configuration,
    hooks, alternates or refs of the upload's), and the tree is sized with ``git ls-tree`` before ``git archive``
    writes it; raises :class:`_Refused` if the commit is not there, or its tree is past the task caps or holds an unsafe
    member (a link that is absolute or leads out of it)."""
    git_dir = source / ".git" if (source / ".git").exists() else source
    if git_dir.is_symlink() or not (git_dir / "objects").is_dir() or (git_dir / "objects").is_symlink():
        raise _Refused(f"repos/{source.name} is not a git repository (a .git folder holding objects/)")
    scratch.parent.mkdir(parents=True)
    untrusted.git(["init", "-q", "--bare", str(scratch)], scratch.parent, check=True)
    shutil.rmtree(scratch / "objects")
    shutil.copytree(git_dir / "objects", scratch / "objects", symlinks=False, ignore_dangling_symlinks=True, copy_function=_link_or_copy,
                    ignore=lambda folder, names: [n for n in names if n in ("alternates", "http-alternates") and Path(folder).name == "info"])
    listed = untrusted.git(["ls-tree", "-r", "-l", "-z", f"{commit}^{{tree}}"], scratch)
    if listed.returncode:
        raise _Refused(f"repos/{source.name} has no commit {commit!r}: {listed.stderr[-300:]}")
    entries = [line.split("\t", 1)[0].split() for line in listed.stdout.split("\0") if line]
    size = sum(int(e[3]) for e in entries if len(e) == 4 and e[3].isdigit())
    if size > base.IMPORTED_TASK_MAX_BYTES or len(entries) > base.IMPORTED_TASK_MAX_FILES:
        raise _Refused(f"repos/{source.name} at {commit[:12]} holds {size} bytes in {len(entries)} files; more than {base.IMPORTED_TASK_MAX_BYTES} "
                       f"bytes or {base.IMPORTED_TASK_MAX_FILES} files is refused")
    archived = untrusted.git(["archive", "--format=tar", "-o", str(scratch.parent / "tree.tar"), f"{commit}^{{tree}}"], scratch)
    if archived.returncode:
        raise _Refused(f"repos/{source.name}: git archive failed on {commit!r}: {archived.stderr[-300:]}")
    _unpack_tree(scratch.parent / "tree.tar", dest, f"repos/{source.name} at {commit[:12]}")


def _link_or_copy(source: str, dest: str) -> None:
    """An object file of the upload into our repository: a hard link (git never writes an object file again), or a copy
    where one cannot be made."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _unpack_tree(archive: Path, dest: Path, what: str) -> None:
    """A repository tree's archive (``git archive``'s, an sdist) into ``dest``, every ``.git`` left out, within the task
    caps; raises :class:`_Refused` for one past them, holding an unsafe member, or unreadable."""
    try:
        unpack_tar(archive, dest, max_bytes=base.IMPORTED_TASK_MAX_BYTES, max_files=base.IMPORTED_TASK_MAX_FILES, what=what, drop_git=True)
    except UnsafeArchive as exc:
        raise _Refused(f"{exc.detail}" + (f" ({exc.member})" if exc.member and not exc.too_large else "")) from exc
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _Refused(f"{what} is not a readable .tar.gz: {exc}") from exc


def _swe_folder(upload: _Upload, instance: dict[str, Any], out: Path) -> tuple[str, Path]:
    """One instance's Harbor folder under ``out`` (module docstring) and its instruction; raises :class:`_Refused`."""
    missing = [k for k in ("repo", "base_commit", "problem_statement", "patch", "test_patch") if not isinstance(instance.get(k), str)]
    if missing:
        raise _Refused(f"the instance lacks {', '.join(missing)} (strings)")
    fail_to_pass, pass_to_pass = _tests(instance, "FAIL_TO_PASS"), _tests(instance, "PASS_TO_PASS")
    python_path = str(instance.get("python_path") or ".")
    if python_path.startswith("/") or ".." in Path(python_path).parts:
        raise _Refused("python_path must be a folder inside the repository")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", instance["repo"]) or ".." in instance["repo"]:
        raise _Refused(f"repo {instance['repo'][:100]!r} is not owner/name")
    if not re.fullmatch(r"[0-9a-fA-F]{7,64}", instance["base_commit"]):
        raise _Refused(f"base_commit {instance['base_commit'][:100]!r} is not a commit's hexadecimal id")
    tree = out / "base"
    tree.mkdir(parents=True)
    source = upload.root / "repos" / instance["repo"].replace("/", "__")
    sdist = source.with_name(source.name + ".tar.gz")
    if source.is_dir() and not source.is_symlink():
        if unsafe := upload.unsafe_in(source):
            raise _Refused(unsafe)
        _checkout(source, instance["base_commit"], out / "git" / "repo.git", tree)
    elif sdist.is_file() and not sdist.is_symlink():
        _unpack_tree(sdist, out / "sdist", f"repos/{sdist.name}")
        entries = list((out / "sdist").iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else out / "sdist"
        shutil.copytree(top, tree, symlinks=True, dirs_exist_ok=True)
    else:
        raise _Refused(upload.unsafe_in(source) or upload.unsafe_in(sdist)
                       or f"neither repos/{source.name}/ (a git repository) nor repos/{sdist.name} (an sdist) is in the archive")
    folder = out / "task"
    app, tests, solution = folder / "environment" / "app", folder / "tests", folder / "solution"
    shutil.copytree(tree, app, symlinks=True)
    swe.commit_all(app, f"{instance['repo']} at {instance['base_commit'][:12]}")
    shutil.copytree(tree, tests / "repo", symlinks=True)
    for label, patch, where in (("test_patch", instance["test_patch"], tests / "repo"), ("patch", instance["patch"], tree)):
        untrusted.git(["init", "-q"], where)
        applied = untrusted.git(["apply", "--whitespace=nowarn", "-"], where, stdin=patch)
        shutil.rmtree(where / ".git", ignore_errors=True)
        if applied.returncode:
            raise _Refused(f"its {label} does not apply to the base commit: {applied.stderr[-300:]}")
    swe.write_verifier(tests, package=".", path=python_path, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass)
    solution.mkdir()
    (solution / "gold.patch").write_text(instance["patch"])
    (solution / "solve.sh").write_text('#!/bin/bash\ncd /app && git apply --whitespace=nowarn /harness/gold.patch\n')
    (folder / "task.toml").write_text(f'[agent]\ntimeout_sec = {swe.AGENT_TIMEOUT_S}\n\n[verifier]\ntimeout_sec = {swe.VERIFIER_TIMEOUT_S}\n')
    instruction = swe.INSTRUCTION.format(project=instance["repo"], path=python_path, issue=instance["problem_statement"])
    (folder / "instruction.md").write_text(instruction)
    return instruction, folder
