"""Hypothesis profiles for the property suite, chosen with HYPOTHESIS_PROFILE (default: ci).

* ``ci``: what ``make test`` runs: 200 examples per property, derandomized (the same examples on
  every run and machine), no deadline (virtual time makes wall-clock deadlines meaningless).
* ``mutants``: what ``make mutants`` runs against each defect: fewer examples, same determinism.
* ``dev``: random examples with the example database, for exploring locally.
"""

from __future__ import annotations

import os
import sys

from hypothesis import HealthCheck, settings

# Hypothesis's pytest plugin imports hypothesis.extra._patching when it reports a failing
# property (to suggest a patch; it needs libcst, which is not installed, so the import fails
# with an ImportError it expects). pytest's assertion rewriter compiles the module first, and on
# CPython 3.11 that compile, deep in a failed test's report, can raise "SystemError: AST
# constructor recursion depth mismatch": the failure became an INTERNALERROR and tools/mutants.py
# saw no failing test (slot_leak_on_abort). A None entry makes the import fail at once.
sys.modules.setdefault("hypothesis.extra._patching", None)  # type: ignore[arg-type]

_common = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", _common, max_examples=200, derandomize=True, database=None)
settings.register_profile("mutants", _common, max_examples=60, derandomize=True, database=None)
settings.register_profile("dev", _common, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# tools/mutants.py runs this suite against a mutated copy of src/: make sure that copy is the one imported.
_under_test = os.environ.get("BRAID_SRC_UNDER_TEST")
if _under_test:
    import braid

    assert os.path.abspath(braid.__file__).startswith(os.path.abspath(_under_test)), (braid.__file__, _under_test)
