"""``python -m polyconv.benchmarks [FLAG] [options]``: the same as ``polyconv bench``."""

import sys

from . import main

sys.exit(main())
