"""``moerun bench``: the expert-compute benchmark matrix (shapes x tokens x backends).

Public: :func:`add_arguments` (flags onto an argparse parser) and :func:`run` (returns an
exit code); ``python -m moerun.bench`` runs it standalone.
"""

from __future__ import annotations

from moerun.bench.command import add_arguments, main, run

__all__ = ["add_arguments", "run", "main"]
