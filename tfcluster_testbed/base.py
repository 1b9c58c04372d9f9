"""Names every test bed module shares: the error type, the host record and the env marker.

A leaf module (imports nothing else from the package), so every other module can depend on it
without creating an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MARKER_ENV", "TestHost", "TestbedError"]

# Every session sshd starts for a host gets this variable (sshd_config SetEnv), so processes that
# escaped the sshd process tree (daemonized, or orphaned by kill_sshd) can still be found by PID scan.
# Read as ``base.MARKER_ENV`` by the other modules, so patching it here reaches all of them.
MARKER_ENV = "TFCLUSTER_TESTBED_HOST"


class TestbedError(RuntimeError):
    """The test bed could not be built or torn down; the message says what and why."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class TestHost:
    """One "host" of the test bed, as a client (launcher) sees it."""

    __test__ = False  # not a pytest test class

    name: str  # test bed name: host0, host1, ...
    address: str  # where its sshd listens
    ssh_port: int
    tf_port: int  # free TensorFlow port on that host
    netns: str | None  # network namespace (netns mode) or None (loopback)
    hostname: str  # what `hostname` prints on it
