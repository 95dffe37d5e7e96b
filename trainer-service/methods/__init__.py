"""Training methods' steps, one module each, registered by :func:`~trainer_service.steps.method_step` under the
``recipe.method`` they implement (declared, with their fields and formats, in :mod:`services.common.recipes`; the
seam: ``trainer_service.steps.Method``; ``merge`` is a job of its own, ``merge.py``).

Importing this package imports every module of it once, so each step registers itself; nothing lists them by hand.
"""

from __future__ import annotations

import importlib
import pkgutil

from trainer_service.steps import STEPS, Method

from services.common import recipes

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

METHODS: dict[str, Method] = {name: STEPS[name]() for name in recipes.METHODS if name in STEPS}
"""Every method this trainer runs, by name, in the order they are declared (``grpo`` without its reward: a job's worker builds ``GRPO(reward)``)."""
