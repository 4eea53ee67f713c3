"""``python -m moerun.bench``: the expert-compute matrix without the ``moerun`` CLI."""

import sys

from moerun.bench.command import main

sys.exit(main())
