"""An operator's upload is data (``crucible admin import-tasks``, :mod:`grader.imports`): building its tasks on the grader
host runs nothing it holds (a git configuration, filter, hook or fsmonitor planted in the tree, in an sdist's own
``.git``), one bad task is refused alone with its reason and every collection reaches a final verdict, and what an
archive unpacks to is capped (bytes and files), not only what it packs to. Each planted command leaves a marker
file if it runs; none may appear."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader import harness_archives, imports
from grader.harness_archives import pack_folder
from grader.sandboxes import get_sandbox
from grader.settings import GraderSettings
from grader.suites import base
from grader.suites.terminal import TASKS_DIR
from grader.teststore import TestStore
from services.common import untrusted
from services.common.errors import PayloadTooLarge, Unprocessable
from tests.archives import pack_upload

PATCH = "--- a/lib.py\n+++ b/lib.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
TEST_PATCH = "--- a/test_lib.py\n+++ b/test_lib.py\n@@ -3,2 +3,2 @@\n def test_f():\n-    assert f() == 1\n+    assert f() == 2\n"


@pytest.fixture()
def grader(tmp_path: Path) -> SimpleNamespace:
    """What the import logic uses of a grader: a real test store, the settings, a queue that sends nothing."""
    return SimpleNamespace(store=TestStore(f"sqlite:///{tmp_path / 'teststore.sqlite'}"),
                           settings=GraderSettings(grader_test_seed=1, data_dir=tmp_path, rollout_wall_s=60, verifier_wall_s=120),
                           enqueue_import=lambda name: None)


def fixture_git(repo: Path, *args: str) -> str:
    """git for building the fixtures, reading no configuration of the tree it commits."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.hooksPath=/dev/null", *args], cwd=repo, env=env,
                          check=True, capture_output=True, text=True).stdout


def project(folder: Path) -> None:
    """A one-function project whose test the instance's patches change."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lib.py").write_text("def f():\n    return 1\n")
    (folder / "test_lib.py").write_text("from lib import f\n\ndef test_f():\n    assert f() == 1\n")


def commit(repo: Path) -> str:
    fixture_git(repo, "init", "-q", "-b", "main")
    fixture_git(repo, "add", "-A")
    fixture_git(repo, "commit", "-q", "--no-verify", "-m", "base")
    return fixture_git(repo, "rev-parse", "HEAD").strip()


def instance(name: str, repo: str, base_commit: str = "0" * 40, **more: object) -> dict[str, object]:
    return {"instance_id": name, "repo": repo, "base_commit": base_commit, "problem_statement": "f is wrong", "FAIL_TO_PASS": ["test_lib.py::test_f"],
            "PASS_TO_PASS": [], "patch": PATCH, "test_patch": TEST_PATCH, **more}


def upload(folder: Path, instances: list[dict[str, object]]) -> bytes:
    (folder / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in instances))
    return pack_upload(folder)


def plant_commands(tree: Path, marker: Path, vector: str) -> None:
    """Plant in ``tree`` a command that touches ``marker`` if git, run over the tree, reads the tree as configuration."""
    touch = f"touch {marker}"
    if vector == "fsmonitor":
        (tree / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "{touch}; false"\n')
    elif vector == "filter":
        (tree / ".gitconfig").write_text(f'[filter "evil"]\n\tclean = "{touch}; cat"\n\tsmudge = "{touch}; cat"\n\tprocess = "{touch}"\n')
        (tree / ".gitattributes").write_text("* filter=evil\n")
    elif vector == "hooks":
        (tree / ".gitconfig").write_text("[core]\n\thooksPath = githooks\n")
        (tree / "githooks").mkdir()
        for hook in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-applypatch", "pre-applypatch"):
            (tree / "githooks" / hook).write_text(f"#!/bin/sh\n{touch}\n")
            (tree / "githooks" / hook).chmod(0o755)
    elif vector == "include":
        (tree / "more.cfg").write_text(f'[core]\n\tfsmonitor = "{touch}; false"\n')
        (tree / ".gitconfig").write_text("[include]\n\tpath = more.cfg\n")


@pytest.mark.parametrize("vector", ["fsmonitor", "filter", "hooks", "include"])
def test_a_committed_tree_that_configures_git_runs_nothing_while_its_task_is_built(grader: SimpleNamespace, tmp_path: Path, vector: str) -> None:
    folder, marker = tmp_path / "upload", tmp_path / "ran"
    repo = folder / "repos" / "acme__evil"
    project(repo)
    plant_commands(repo, marker, vector)
    base_commit = commit(repo)
    out = imports.import_collection(grader, "c", "swe", upload(folder, [instance("evil-1", "acme/evil", base_commit)]))  # type: ignore[arg-type]
    assert not marker.exists(), f"the upload's {vector} ran on the host"
    assert [(t.name, t.status, t.reason) for t in out.tasks] == [("evil-1", "pending", None)]


@pytest.mark.parametrize("vector", ["fsmonitor", "filter", "hooks", "include", "own .git"])
def test_an_sdist_that_configures_git_or_carries_its_own_git_runs_nothing(grader: SimpleNamespace, tmp_path: Path, vector: str) -> None:
    folder, marker = tmp_path / "upload", tmp_path / "ran"
    tree = tmp_path / "sdist" / "evil-1.0"
    project(tree)
    if vector == "own .git":  # the sdist's repository configures git and holds hooks; `git init` over it would keep them
        commit(tree)
        fixture_git(tree, "config", "core.fsmonitor", f"touch {marker}; false")
        fixture_git(tree, "config", "filter.evil.clean", f"touch {marker}; cat")
        (tree / ".gitattributes").write_text("* filter=evil\n")
        for hook in ("pre-commit", "commit-msg", "post-commit"):
            (tree / ".git" / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
            (tree / ".git" / "hooks" / hook).chmod(0o755)
    else:
        plant_commands(tree, marker, vector)
    (folder / "repos").mkdir(parents=True)
    (folder / "repos" / "acme__evil.tar.gz").write_bytes(pack_upload(tree))
    out = imports.import_collection(grader, "c", "swe", upload(folder, [instance("evil-1", "acme/evil")]))  # type: ignore[arg-type]
    assert not marker.exists(), f"the sdist's {vector} ran on the host"
    assert [(t.name, t.status, t.reason) for t in out.tasks] == [("evil-1", "pending", None)]
    task = tmp_path / "task"
    untrusted.unpack_tar(grader.store.collection("c", with_archives=True)[0].archive, task, max_bytes=1 << 24, max_files=1000)
    assert (task / "environment" / "app" / ".git").is_dir() and not any((task / "tests" / "repo").rglob(".git"))
    assert untrusted.git(["config", "--local", "--list"], task / "environment" / "app").stdout.count("fsmonitor") == 0


def test_the_platforms_git_reads_no_configuration_of_the_folder_it_runs_in(tmp_path: Path) -> None:
    """:func:`services.common.untrusted.git` itself: a ``.gitconfig``, ``.config/git/config`` or ``.config/git/attributes``
    of the working folder, or of the caller's ``HOME``, is not read."""
    marker = tmp_path / "ran"
    home = tmp_path / "home"
    for where in (tmp_path / "work", home):
        (where / ".config" / "git").mkdir(parents=True)
        (where / ".gitconfig").write_text(f'[core]\n\tfsmonitor = "touch {marker}; false"\n[filter "evil"]\n\tclean = "touch {marker}; cat"\n')
        (where / ".config" / "git" / "config").write_text(f'[core]\n\tfsmonitor = "touch {marker}; false"\n')
        (where / ".config" / "git" / "attributes").write_text("* filter=evil\n")
    (tmp_path / "work" / "a.txt").write_text("a\n")
    old = os.environ.copy()
    os.environ.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), GIT_CONFIG_GLOBAL=str(home / ".gitconfig"))
    try:
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"], ["status"]):
            done = untrusted.git(args, tmp_path / "work")
            assert done.returncode == 0, done.stderr
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert not marker.exists()


def test_a_committed_link_out_of_the_tree_refuses_its_task_alone(grader: SimpleNamespace, tmp_path: Path) -> None:
    """A committed absolute link, or a relative one climbing out, refuses its instance; the good one beside it is kept."""
    folder = tmp_path / "upload"
    project(good := folder / "repos" / "acme__good")
    good_commit = commit(good)
    instances = [instance("good-1", "acme/good", good_commit)]
    for name, target in (("absolute", "/etc/passwd"), ("climbing", "../../../../etc/passwd")):
        project(repo := folder / "repos" / f"acme__{name}")
        (repo / "link").symlink_to(target)
        instances.append(instance(f"{name}-1", f"acme/{name}", commit(repo)))
        (repo / "link").unlink()  # the commit holds the link; the working tree does not (the upload itself is sound)
    out = imports.import_collection(grader, "c", "swe", upload(folder, instances))  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason) for t in out.tasks}
    assert verdicts["good-1"] == ("pending", None)
    for name in ("absolute-1", "climbing-1"):
        status, reason = verdicts[name]
        assert status == "refused" and "link" in reason and "unsafe" in reason, reason


def test_a_task_folder_holding_a_link_out_of_the_upload_is_refused_alone(grader: SimpleNamespace, tmp_path: Path) -> None:
    folder = tmp_path / "acme"
    shutil.copytree(TASKS_DIR / "fizzbuzz-script", folder / "fizzbuzz-script")
    shutil.copytree(TASKS_DIR / "dedupe-lines", folder / "leaky")
    (folder / "leaky" / "environment").mkdir(exist_ok=True)
    (folder / "leaky" / "environment" / "passwd").symlink_to("/etc/passwd")
    out = imports.import_collection(grader, "c", "terminal", pack_upload(folder))  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason) for t in out.tasks}
    assert verdicts["fizzbuzz-script"] == ("pending", None)
    assert verdicts["leaky"][0] == "refused" and "leaky/environment/passwd" in verdicts["leaky"][1], verdicts


def test_a_test_patch_that_makes_a_link_out_of_the_tree_is_refused_and_the_collection_is_done(grader: SimpleNamespace, tmp_path: Path) -> None:
    folder = tmp_path / "upload"
    project(repo := folder / "repos" / "acme__good")
    base_commit = commit(repo)
    link = "diff --git a/secret b/secret\nnew file mode 120000\n--- /dev/null\n+++ b/secret\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
    instances = [instance("good-1", "acme/good", base_commit), instance("link-1", "acme/good", base_commit, test_patch=TEST_PATCH + link)]
    out = imports.import_collection(grader, "c", "swe", upload(folder, instances))  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason) for t in out.tasks}
    assert verdicts["good-1"] == ("pending", None)
    assert verdicts["link-1"][0] == "refused" and "tests/repo/secret" in verdicts["link-1"][1], verdicts


def stored(grader: SimpleNamespace, rows: dict[str, bytes]) -> None:
    """Tasks stored pending as an earlier version of the import would have stored them."""
    grader.store.add_collection("c", "terminal", [{"name": n, "instruction": "x", "digest": hashlib.sha256(a).hexdigest(), "archive": a,
                                                   "status": "pending", "reason": None} for n, a in rows.items()])


def tar_with(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def test_a_task_that_fails_to_validate_is_refused_and_the_collection_is_done(grader: SimpleNamespace, endpoint: object, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored task whose archive cannot be unpacked (an absolute link), one whose validation raises, and one whose
    validation stopped its worker twice are each refused with why; validation runs no sandbox for them."""
    link = tarfile.TarInfo("tests/secret")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    stored(grader, {"link": tar_with((link, b"")), "raises": b"x", "crashed": b"y"})
    grader.store.judge("c", "crashed", "pending", "validating (attempt 2)")
    real = imports.validate_task

    def validate_task(sandbox: object, endpoint: object, suite: str, archive: bytes, *args: object) -> str | None:
        if archive == b"x":
            raise RuntimeError("boom")
        return real(sandbox, endpoint, suite, archive, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(imports, "validate_task", validate_task)
    imports.validate_collection(grader, "c", None, endpoint)  # type: ignore[arg-type]
    out = imports.collection_out(grader, "c")  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason or "") for t in out.tasks}
    assert out.status == "done" and {s for s, _ in verdicts.values()} == {"refused"}, verdicts
    assert "link to an absolute path" in verdicts["link"][1] and "boom" in verdicts["raises"][1] and "2 times" in verdicts["crashed"][1], verdicts


def test_a_stored_task_that_unpacks_past_the_cap_is_refused(grader: SimpleNamespace, endpoint: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few KB that unpack to MBs (of bytes, or of files) are refused once the cap is reached, not unpacked."""
    monkeypatch.setattr(base, "IMPORTED_TASK_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(base, "IMPORTED_TASK_MAX_FILES", 100)
    big = tarfile.TarInfo("environment/app/zeros")
    big.size = 8 << 20
    many = [(tarfile.TarInfo(f"environment/app/f{i}"), b"") for i in range(200)]
    bomb, swarm = tar_with((big, b"\0" * big.size)), tar_with(*many)
    assert len(bomb) < 20_000
    stored(grader, {"bomb": bomb, "swarm": swarm})
    imports.validate_collection(grader, "c", None, endpoint)  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason or "") for t in imports.collection_out(grader, "c").tasks}  # type: ignore[arg-type]
    assert verdicts["bomb"][0] == "refused" and "more than 1048576 bytes" in verdicts["bomb"][1], verdicts
    assert verdicts["swarm"][0] == "refused" and "more than 100 files" in verdicts["swarm"][1], verdicts
    assert not list((base.CACHE_DIR / "imported").glob(f"{hashlib.sha256(bomb).hexdigest()}*/environment/app/zeros"))


def test_an_imported_task_or_sdist_that_unpacks_past_the_cap_is_refused_alone(grader: SimpleNamespace, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "IMPORTED_TASK_MAX_BYTES", 1 << 20)
    folder = tmp_path / "upload"
    project(repo := folder / "repos" / "acme__good")
    base_commit = commit(repo)
    project(sdist := tmp_path / "sdist" / "big-1.0")
    (sdist / "zeros.bin").write_bytes(b"\0" * (4 << 20))
    project(zipped := tmp_path / "zipped" / "zipped-1.0")
    (folder / "repos" / "acme__big.tar.gz").write_bytes(pack_upload(sdist))
    (folder / "repos" / "acme__zipped.tar.gz").write_bytes(pack_upload(zipped))
    instances = [instance("good-1", "acme/good", base_commit), instance("big-1", "acme/big"), instance("zipped-1", "acme/zipped")]
    out = imports.import_collection(grader, "c", "swe", upload(folder, instances))  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason or "") for t in out.tasks}
    assert verdicts["good-1"] == verdicts["zipped-1"] == ("pending", ""), verdicts
    assert verdicts["big-1"][0] == "refused" and "more than 1048576 bytes" in verdicts["big-1"][1], verdicts


def test_an_upload_that_unpacks_past_the_cap_is_refused_naming_the_file(grader: SimpleNamespace, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imports, "MAX_UNPACKED_BYTES", 1 << 20)
    monkeypatch.setattr(imports, "MAX_UPLOAD_FILES", 100)
    big = tarfile.TarInfo("acme/zeros")
    big.size = 8 << 20
    for data in (tar_with((big, b"\0" * big.size)), tar_with(*[(tarfile.TarInfo(f"acme/f{i}"), b"") for i in range(200)])):
        with pytest.raises(PayloadTooLarge) as exc:
            imports.import_collection(grader, "c", "terminal", data)  # type: ignore[arg-type]
        assert exc.value.extra["field"] == "file"


def test_a_harness_archive_whose_headers_unpack_past_the_cap_is_refused_before_they_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PAX header of megabytes (a few KB packed) is refused by the stream's cap; unpacking counts bytes and files."""
    monkeypatch.setattr(harness_archives, "MAX_UNPACKED_BYTES", 64 * 1024)
    monkeypatch.setattr(harness_archives, "MAX_MEMBERS", 10)
    manifest = b'name = "h"\nentry = "true"\n'
    info = tarfile.TarInfo("harness.toml")
    info.size = len(manifest)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info.pax_headers = {"comment": "x" * (4 << 20)}
        tar.addfile(info, io.BytesIO(manifest))
    assert len(buf.getvalue()) < 50_000
    with pytest.raises(Unprocessable) as exc:
        harness_archives.inspect_archive(buf.getvalue())
    assert exc.value.extra["field"] == "file" and "more than" in exc.value.detail
    big = tarfile.TarInfo("zeros")
    big.size = 1 << 20
    with pytest.raises(untrusted.UnsafeArchive):
        harness_archives.unpack(tar_with((info, manifest), (big, b"\0" * big.size)), tmp_path / "h")


def test_unpacking_refuses_what_leaves_the_tree_and_caps_a_gzip_bomb(tmp_path: Path) -> None:
    """The shared unpacker: a header of megabytes (a GNU long name, read whole before its member is seen) stops at the
    stream's cap; links out of the tree are refused, or left out and reported; ``.git`` is dropped on request."""
    long_name = tarfile.TarInfo("a/" + "x" * (8 << 20))
    bomb = io.BytesIO()
    with tarfile.open(fileobj=bomb, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(long_name)
    assert len(bomb.getvalue()) < 50_000
    with pytest.raises(untrusted.UnsafeArchive) as exc:
        untrusted.unpack_tar(bomb.getvalue(), tmp_path / "z", max_bytes=1000, max_files=10)
    assert exc.value.too_large
    link = tarfile.TarInfo("a/link")
    link.type, link.linkname = tarfile.SYMTYPE, "../../elsewhere"
    git = tarfile.TarInfo("a/.git/config")
    ok = tarfile.TarInfo("a/ok")
    hard = tarfile.TarInfo("a/config")  # a hard link to a member left out
    hard.type, hard.linkname = tarfile.LNKTYPE, "a/.git/config"
    data = tar_with((link, b""), (git, b""), (ok, b""), (hard, b""))
    with pytest.raises(untrusted.UnsafeArchive) as exc:
        untrusted.unpack_tar(data, tmp_path / "x", max_bytes=1000, max_files=10)
    assert exc.value.member == "a/link" and not exc.value.too_large
    skipped = untrusted.unpack_tar(data, tmp_path / "y", max_bytes=1000, max_files=10, skip_unsafe=True, drop_git=True)
    assert [name for name, _ in skipped] == ["a/link", "a/config"] and (tmp_path / "y" / "a" / "ok").is_file() and not (tmp_path / "y" / "a" / ".git").exists()


def test_in_a_real_sandbox_a_bad_task_is_refused_beside_a_good_one_and_the_collection_is_done(grader: SimpleNamespace, endpoint: object,
                                                                                                backend: str) -> None:
    """On each sandbox backend: a shipped task is accepted, a stored task holding an absolute link and one that unpacks
    past the cap are refused with their reasons, and the collection is done."""
    link = tarfile.TarInfo("tests/secret")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    big = tarfile.TarInfo("environment/app/zeros")
    big.size = base.IMPORTED_TASK_MAX_BYTES + 1
    with io.BytesIO() as raw:
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:  # the header alone: the unpacker refuses before reading its data
            tar.addfile(big)
        header_only = raw.getvalue()
    stored(grader, {"fizzbuzz-script": pack_folder(TASKS_DIR / "fizzbuzz-script"), "link": tar_with((link, b"")), "bomb": header_only})
    imports.validate_collection(grader, "c", get_sandbox(backend), endpoint)  # type: ignore[arg-type]
    out = imports.collection_out(grader, "c")  # type: ignore[arg-type]
    verdicts = {t.name: (t.status, t.reason or "") for t in out.tasks}
    assert out.status == "done" and verdicts["fizzbuzz-script"] == ("accepted", ""), verdicts
    assert verdicts["link"][0] == verdicts["bomb"][0] == "refused" and "unpacks to more than" in verdicts["bomb"][1], verdicts


def test_git_leaves_no_folder_of_its_own_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git's empty HOME is the call's and goes with it: a long-lived eval worker whose temporary folder is the shared
    sandbox directory (compose) kept one there for its whole life, which reads as a rollout left behind."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    (tmp_path / "repo").mkdir()
    assert untrusted.git(["init", "-q"], tmp_path / "repo").returncode == 0
    assert list(scratch.iterdir()) == []
