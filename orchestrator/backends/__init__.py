"""Stage 3: backends. How tasks reach nodes and how their bytes come back (SSH today; the seam in
``backend.py`` takes schedulers whose nodes connect back over TCP)."""

from .backend import Backend, Deliver
from .base import Channel, ConnectFailure, Connection, OutputTooLarge
from .diagnose import entry_failure

__all__ = ["Backend", "Channel", "ConnectFailure", "Connection", "Deliver", "OutputTooLarge", "entry_failure"]
