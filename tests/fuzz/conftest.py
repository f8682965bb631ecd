"""Hypothesis profiles for the fuzz tier.

The default profile is derandomized and keeps no example database, so ``make test`` is repeatable
and writes nothing into the tree. ``KVR_FUZZ_PROFILE=hunt`` draws fresh random examples, and
``KVR_FUZZ_SCALE=20`` multiplies every test's example budget, when hunting for new crashes by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}
settings.register_profile("ci", derandomize=True, print_blob=True, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("hunt", print_blob=True, **_COMMON)  # type: ignore[arg-type]
settings.load_profile(os.environ.get("KVR_FUZZ_PROFILE", "ci"))
