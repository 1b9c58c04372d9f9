"""TensorFlow's known chatter: the lines every TF process prints at start-up (and a few per step) that say
nothing about *this* job. The one list of them; the console hides them by default (``--all-output`` shows
them), the logs always keep them (a run's record is the bytes as printed).

A pattern is matched against a line as a terminal shows it (``core.terminal.safe_bytes``), with glog's
header (``W0000 00:00:1795777703.404786   31791 ``: level, date, time, thread) taken off, so one pattern
fits every process, thread and second. Each entry says where the line comes from, so that a pattern is
only added for a line that is known noise, never for one that may carry a job's problem.
"""

from __future__ import annotations

import re

#: glog's line header as TF (absl) writes it: level letter, MMDD, time, thread id.
GLOG_HEADER = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+(?:\.\d+)? +\d+ ")

#: (why it is noise, the pattern) — searched in the line without its glog header.
PATTERNS: tuple[tuple[str, bytes], ...] = (
    (
        "absl: printed once per process before its logging is set up",
        rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    ),
    ("TF's CPU-instruction banner (cpu_feature_guard.cc)", rb"^cpu_feature_guard\.cc:\d+\] This TensorFlow binary is"),
    ("the banner's second line", rb"^To enable the following instructions: .*rebuild TensorFlow with the appropriate"),
    ("oneDNN's numerical-results notice (port.cc / util.cc)", rb"oneDNN custom operations are on\."),
    ("a CPU-only host: no CUDA driver (cudart_stub.cc, cuda_init.cc)", rb"Could not find cuda drivers on your machine"),
    ("a CPU-only host: cuInit failed (cuda_executor.cc, cuda_diagnostics.cc)", rb"failed call to cuInit"),
    ("CUDA plugin registered twice (cuda_dnn/cuda_fft/cuda_blas)", rb"Unable to register cu(?:DNN|FFT|BLAS) factory"),
    ("the same, its second form", rb"^computation_placer\.cc:\d+\] computation placer already registered"),
    ("TensorRT not installed (py_utils / tf2tensorrt)", rb"TF-TRT Warning: Could not find TensorRT"),
    ("NUMA node unknown in a container (cuda_executor.cc)", rb"could not open file to read NUMA node"),
    (
        "ParameterServerStrategy: per step, when a remote function handle is released (kernel_and_device.cc)",
        rb"^kernel_and_device\.cc:\d+\] Ignoring error status when releasing multi-device function handle UNIMPLEMENTED",
    ),
    ("tf.data: malloc tuning notice per generator dataset", rb"^generator_dataset_op\.cc:\d+\] Memory patch applied"),
)

_NOISE = re.compile(b"|".join(b"(?:" + p + b")" for _, p in PATTERNS))


def strip_glog(line: bytes) -> bytes:
    """``line`` without glog's header (what differs between processes and threads printing the same thing)."""
    m = GLOG_HEADER.match(line)
    return line[m.end() :] if m else line


def is_noise(line: bytes) -> bool:
    """Whether one line (no newline) is known TensorFlow chatter."""
    return _NOISE.search(strip_glog(line)) is not None
