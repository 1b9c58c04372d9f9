"""``python -m worker_entry [run|connect|slurm|kubernetes|probe|manifest|send|receive]``: the node agent
(``worker_entry.agent.main``)."""

import sys

from .agent.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
