"""Ways to reach a node. The supervisor only sees Connection and Channel."""

from .base import Channel, ConnectFailure, Connection

__all__ = ["Channel", "ConnectFailure", "Connection"]
