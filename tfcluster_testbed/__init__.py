"""A multi-host SSH test bed: N real OpenSSH ``sshd`` "hosts" on this one machine.

Used by the test suite, the benchmarks and ``tfcluster demo``. Two modes:

* **loopback** (any user with sshd installed): host *i* is ``127.0.0.(i+2)`` with its own sshd on a
  free port. All hosts share one network stack, so every host gets a different TensorFlow port
  (TF's gRPC server binds ``*:port``).
* **netns** (root): every host is a network namespace with its own address, hostname and sshd on
  port 22, joined by veth pairs to a private bridge that lives in its own namespace, with the SAME
  TensorFlow port on every host, like a real cluster. The launcher under test runs in a controller
  namespace on that bridge (:meth:`Testbed.launcher_argv`); nothing is routed to the real network.

Cleanup is the point: :meth:`Testbed.stop` ends everything the test bed started by PID only (never
by name or pattern), deletes its namespaces and its temp dir; it is idempotent and registered with
``atexit``. A test bed whose owner died without stopping it (SIGKILL) is cleaned up by
:func:`reap_stale`, from the ``state.json`` every test bed keeps in its directory.

This package imports nothing from ``orchestrator`` or ``worker_entry`` on purpose: it is test
infrastructure, and must keep working while the code under test is broken. The one exception is the
subpackage ``loadgen`` (the load generator: N fake nodes speaking worker_entry's protocol), which
imports ``worker_entry``'s protocol and handshake and is not imported from here. It needs ``sshd`` and
``ssh-keygen`` on the machine (and ``ip``/``unshare`` for netns mode).

Modules (each imports only those above it): ``base`` (error, host record, env marker), ``procs``
(process identity, /proc scans, ordered kills), ``net`` (ports, subnets, namespaces), ``state``
(state.json, teardown, reap_stale), ``keys``, ``sshd``, ``faults`` (a host's sshd killed and
restarted, its link cut, its rate limited), ``hostprocs`` (which process is on which host), ``spec``
(the spec and the ssh command line for the hosts), ``bed`` (the Testbed class), ``leftovers``, ``cli``
(``python -m tfcluster_testbed``); ``waiting`` (the one polling loop of the tests and benchmarks)
imports nothing.
Module-level settings are read through their defining module at call time, so tests patch them
there: e.g. ``tfcluster_testbed.sshd.SSHD``, ``tfcluster_testbed.state.DIR_PREFIX``,
``tfcluster_testbed.net._free_port``.
"""

from .base import MARKER_ENV, TestbedError, TestHost
from .bed import Testbed
from .cli import main
from .leftovers import assert_no_leftovers, leftovers
from .net import netns_available
from .state import reap_stale

__all__ = [
    "MARKER_ENV",
    "TestHost",
    "Testbed",
    "TestbedError",
    "assert_no_leftovers",
    "leftovers",
    "main",
    "netns_available",
    "reap_stale",
]
