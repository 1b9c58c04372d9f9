"""A task's stream as lines of a Kubernetes pod log, and the pod's own settings.

In a pod nobody holds a channel to worker_entry: the pod log *is* the channel (the launcher follows
it through the API, and ``kubectl logs`` shows the same). So worker_entry prints, in order, on the
container's stdout:

- every line the training process printed (stdout and stderr, in the order they were read), as is —
  except that a line beginning with ``@``\\ s then ``@tfcluster`` gets one more ``@`` (like mbox's
  ``>From``), so no line the user prints can pass for a message;
- each protocol message as one line ``@tfcluster {json}`` (the JSON of the same message an SSH
  channel carries in a MSG frame).

``decode_line`` undoes it exactly. ``PodConfig`` is what the rendering puts into the pod's
``TFCLUSTER_POD`` variable: the cluster and how worker_entry runs; the pod adds its own index.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .config import NodeConfig
from .schema import Record, spec

MARKER = b"@tfcluster "
_ESCAPED = re.compile(rb"^@*@tfcluster")  # lines that need (or got) one more '@'
#: 2: the task type's ``NodeConfig`` (the launcher's one builder made it), instead of its fields one by one
POD_CONFIG_VERSION = 2


def encode_output(data: bytes) -> bytes:
    """Complete output lines (``data`` ends with a newline) as pod-log lines."""
    if b"@tfcluster" not in data:  # the common case costs one search
        return data
    lines = data.split(b"\n")
    return b"\n".join(b"@" + ln if _ESCAPED.match(ln) else ln for ln in lines)


def encode_message(payload: bytes) -> bytes:
    """One message line; ``payload`` is compact JSON (json.dumps escapes every newline)."""
    return MARKER + payload + b"\n"


def decode_line(line: bytes) -> tuple[bool, bytes]:
    """One pod-log line without its newline → (is_message, JSON payload or the original line)."""
    if line.startswith(MARKER):
        return True, line[len(MARKER) :]
    if line.startswith(b"@@") and _ESCAPED.match(line):
        return False, line[1:]
    return False, line


@dataclass
class PodConfig(Record):
    """worker_entry's settings in a pod (``TFCLUSTER_POD``), the same for every pod of a task type: its
    type's ``NodeConfig`` as the launcher's plan builds it (``NodePlan.node_config``: the cluster, the
    timings; no environment, which is the container's, and no command, which follows ``--``). The pod
    makes it its own with its index (``JOB_COMPLETION_INDEX``) and attempt."""

    config: NodeConfig
    remote_dir: str = field(metadata=spec(max_len=4096))  # each task's directory: REMOTE_DIR/<type>-<index>
    v: int = field(default=POD_CONFIG_VERSION, metadata=spec(lo=POD_CONFIG_VERSION, hi=POD_CONFIG_VERSION))
    # tasks of its type when the type is outside the cluster (the evaluator): the valid completion indexes
    tasks: int | None = field(default=None, metadata=spec(lo=1, hi=100_000))
