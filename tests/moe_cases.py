"""Test-side names for the seeded inputs and the unsharded reference (see moerun.testing)."""

from moerun.testing import (  # noqa: F401
    TOL,
    TOL_FP8,
    TOL_FP8_UNQUANTIZED,
    TOL_MULTIRANK_BF16,
    GlobalCase,
    make_case,
    reference_output,
    rel_err,
    shared_reference,
    unquantized_reference,
)
