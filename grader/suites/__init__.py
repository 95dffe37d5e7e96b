"""Evaluation suites. A suite is one module here: its dataset generator, its default harness and its scorer,
in a class decorated with :func:`~grader.suites.base.register_suite`.

The grader's orchestration only sees the :class:`~grader.suites.base.Suite` protocol and finds a suite by name
(:func:`get_suite`). Adding a suite is adding one module to this package (and its tests): the lookup imports every
module of the package once, so each registers itself; nothing lists the suites by hand. Suite modules build on
:mod:`grader.suites.base`; the rest of the grader imports the names below from this package.
"""

from __future__ import annotations

import importlib
import pkgutil

from grader.suites.base import (
    SUITES,
    Complete,
    Item,
    Suite,
    TaskEnvironment,
    TurnLimitReached,
    chao1,
    suite_canonical,
    suite_converse,
    suite_environment,
    suite_tools,
)
from services.common.errors import Unprocessable
from services.common.lazy import once

__all__ = ["Complete", "Item", "Suite", "TaskEnvironment", "TurnLimitReached", "chao1", "get_suite", "suite_canonical", "suite_converse", "suite_environment",
           "suite_names", "suite_tools"]


@once
def _import_suite_modules() -> None:
    """Import every module of this package (once per process), so that each suite registers itself."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def suite_names() -> list[str]:
    """The registered suites' names, sorted."""
    _import_suite_modules()
    return sorted(SUITES)


def get_suite(name: str) -> Suite:
    """A new instance of the suite named ``name``; raises ``Unprocessable`` (field ``suite.name``) if there is none."""
    _import_suite_modules()
    if name not in SUITES:
        raise Unprocessable(f"unknown suite {name!r}; available: {', '.join(suite_names())}", field="suite.name")
    return SUITES[name]()
