"""The SSH backend (paramiko): verified host keys at every hop, agent and key files, ~/.ssh/config."""

from .connection import KeyCache, SshChannel, SshConnection
from .fleet import HostFailure, SshBackend, close_all, connect_all, make_connection

__all__ = [
    "HostFailure",
    "KeyCache",
    "SshBackend",
    "SshChannel",
    "SshConnection",
    "close_all",
    "connect_all",
    "make_connection",
]
