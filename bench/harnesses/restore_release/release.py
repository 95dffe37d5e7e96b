"""The restore-the-release harness as an archive: :file:`harness.toml` and :file:`run.sh` of this folder, with each
project's released library files (the ``.py`` files of its package folder, as the public sdist unpacked by
``make swe-projects`` holds them) under ``release/<project>/``.

    from bench.harnesses.restore_release.release import archive
    data = archive(["cachetools", "inflection"])   # bytes of a .tar.gz, for POST /v1/harnesses or a rollout
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from grader.harness_archives import pack_folder
from grader.suites.swe_mutants import PROJECTS

HERE = Path(__file__).parent


def archive(projects: Iterable[str] = tuple(PROJECTS)) -> bytes:
    """The harness archive carrying the releases of ``projects`` (names of :data:`~grader.suites.swe_mutants.PROJECTS`;
    default all of them). Raises ``KeyError`` for an unknown name."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "harness"
        folder.mkdir()
        for name in ("harness.toml", "run.sh"):
            shutil.copy(HERE / name, folder / name)
        for name in projects:
            project = PROJECTS[name]
            for path in sorted((project.repo / project.package).rglob("*.py")):
                target = folder / "release" / name / path.relative_to(project.repo)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
        return pack_folder(folder)
