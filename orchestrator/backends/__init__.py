"""Stage 3: backends. How tasks reach nodes and how their bytes come back: the seam (``backend.py``),
channels, the SSH transport and fleet, and the TCP connect-back channel schedulers use. What a
scheduler adds on top lives in its package under ``orchestrator/schedulers/``."""

from .backend import Backend, Deliver, PerTaskBackend, Placement
from .base import Channel, ConnectFailure, Connection, OutputTooLarge, wait_readable
from .diagnose import agent_crash, entry_failure

__all__ = [
    "Backend",
    "Channel",
    "ConnectFailure",
    "Connection",
    "Deliver",
    "OutputTooLarge",
    "PerTaskBackend",
    "Placement",
    "agent_crash",
    "entry_failure",
    "wait_readable",
]
