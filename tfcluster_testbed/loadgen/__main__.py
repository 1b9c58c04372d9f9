"""``python -m tfcluster_testbed.loadgen``: see :mod:`tfcluster_testbed.loadgen.loop`."""

import sys

from .loop import main

if __name__ == "__main__":
    sys.exit(main())
