"""The contract between the launcher and a node: frames, the node's config, every message, env names.

Standard library only: it runs on every node, and the launcher imports it from here. ``frames``: the
byte stream; ``schema``: validation on receipt; ``messages``: ``NodeConfig`` and every message;
``samples``: the host and GPU evidence in heartbeats; ``env``: the environment variable names. A bad message becomes one ``ProtocolError`` naming the field.
"""

import importlib
from typing import Any

# Lazy: ``from worker_entry.protocol.env import Env`` (the instrumentation in every user process) must
# not pay for building the message classes; ``protocol.Hello`` loads ``messages`` on first use.
_LAZY = {
    "Bye": "messages",
    "COMMANDS": "messages",
    "DiskInfo": "messages",
    "Done": "messages",
    "Env": "env",
    "Exited": "messages",
    "Fetch": "messages",
    "FileEnd": "messages",
    "FileEntry": "messages",
    "FileError": "messages",
    "FileRequest": "messages",
    "FileStart": "messages",
    "Frame": "frames",
    "FrameDecoder": "frames",
    "Go": "messages",
    "GpuInfo": "messages",
    "GpuProcess": "samples",
    "GpuSample": "samples",
    "HEADER": "frames",
    "Heartbeat": "messages",
    "is_chief": "cluster",
    "task_order": "cluster",
    "Hello": "messages",
    "HostSample": "samples",
    "MARKER": "frames",
    "MAX_COMMAND_LINE": "frames",
    "MAX_PAYLOAD": "frames",
    "MAX_PREAMBLE": "frames",
    "Manifest": "messages",
    "ManifestReply": "messages",
    "Message": "messages",
    "NODE_MESSAGES": "messages",
    "NodeConfig": "messages",
    "NodeFacts": "messages",
    "NodeProblem": "messages",
    "OFF_VALUES": "env",
    "PATH_VARS": "env",
    "Ping": "messages",
    "Profile": "messages",
    "Progress": "messages",
    "ProtocolError": "frames",
    "Record": "schema",
    "STDERR": "frames",
    "STDOUT": "frames",
    "SkippedEntry": "messages",
    "Spawned": "messages",
    "Started": "messages",
    "Stop": "messages",
    "Stopping": "messages",
    "StrategyInfo": "messages",
    "TRANSFER_MESSAGES": "messages",
    "T_DATA": "frames",
    "T_LOG": "frames",
    "T_MSG": "frames",
    "TaskFiles": "messages",
    "TaskRef": "messages",
    "VERSION": "messages",
    "command_line": "frames",
    "data_frame": "frames",
    "log_frame": "frames",
    "msg_frame": "frames",
    "parse": "messages",
    "parse_command": "messages",
    "parse_message": "messages",
    "spec": "schema",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "COMMANDS",
    "HEADER",
    "MARKER",
    "MAX_COMMAND_LINE",
    "MAX_PAYLOAD",
    "MAX_PREAMBLE",
    "NODE_MESSAGES",
    "OFF_VALUES",
    "PATH_VARS",
    "STDERR",
    "STDOUT",
    "TRANSFER_MESSAGES",
    "T_DATA",
    "T_LOG",
    "T_MSG",
    "VERSION",
    "Bye",
    "DiskInfo",
    "Done",
    "Env",
    "Exited",
    "Fetch",
    "FileEnd",
    "FileEntry",
    "FileError",
    "FileRequest",
    "FileStart",
    "Frame",
    "FrameDecoder",
    "Go",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "Heartbeat",
    "Hello",
    "HostSample",
    "Manifest",
    "ManifestReply",
    "Message",
    "NodeConfig",
    "NodeFacts",
    "NodeProblem",
    "Ping",
    "Profile",
    "Progress",
    "ProtocolError",
    "Record",
    "SkippedEntry",
    "Spawned",
    "Started",
    "Stop",
    "Stopping",
    "StrategyInfo",
    "TaskFiles",
    "TaskRef",
    "command_line",
    "data_frame",
    "log_frame",
    "msg_frame",
    "parse",
    "parse_command",
    "parse_message",
    "spec",
]
