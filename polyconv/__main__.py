"""``python -m polyconv``: the ``polyconv`` command."""

import sys

from ._cli import main

sys.exit(main())
