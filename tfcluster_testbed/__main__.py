"""``python -m tfcluster_testbed``: see :mod:`tfcluster_testbed.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
