"""Every environment variable name tfcluster sets or reads (one place; docs/architecture.md lists them)."""

from __future__ import annotations


class Env:
    """Every environment variable tfcluster sets or reads, by name (docs/architecture.md lists them)."""

    TF_CONFIG = "TF_CONFIG"
    # a TF_CONFIG beyond the kernel's limit for one variable: the file it is in (sitecustomize sets TF_CONFIG)
    TF_CONFIG_FILE = "TFCLUSTER_TF_CONFIG_FILE"
    LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
    JOB = "TFCLUSTER_JOB"
    RUN_ID = "TFCLUSTER_RUN_ID"
    ATTEMPT = "TFCLUSTER_ATTEMPT"
    TASK_TYPE = "TFCLUSTER_TASK_TYPE"
    TASK_INDEX = "TFCLUSTER_TASK_INDEX"
    NUM_TASKS = "TFCLUSTER_NUM_TASKS"
    NUM_WORKERS = "TFCLUSTER_NUM_WORKERS"  # this attempt's training tasks (chief and workers): fewer after a shrink
    PLANNED_WORKERS = "TFCLUSTER_PLANNED_WORKERS"  # ... as planned (the batch-size rule: global / NUM_WORKERS)
    IS_CHIEF = "TFCLUSTER_IS_CHIEF"
    NUM_GPUS = "TFCLUSTER_NUM_GPUS"
    COMMUNICATION = "TFCLUSTER_COMMUNICATION"
    COLLECTIVE_TIMEOUT_S = "TFCLUSTER_COLLECTIVE_TIMEOUT_S"
    HEARTBEAT_TIMEOUT_S = "TFCLUSTER_HEARTBEAT_TIMEOUT_S"
    CHECKPOINT_DIR = "TFCLUSTER_CHECKPOINT_DIR"
    BACKUP_DIR = "TFCLUSTER_BACKUP_DIR"
    INSTRUMENT = "TFCLUSTER_INSTRUMENT"
    PROFILE_INTERVAL_S = "TFCLUSTER_PROFILE_INTERVAL_S"
    STEPCLOCK = "TFCLUSTER_STEPCLOCK"
    STAMP_SYNC = "TFCLUSTER_STAMP_SYNC"
    GRADNOISE = "TFCLUSTER_GRADNOISE"  # 0: the step clock leaves the gradient noise scale's norms out
    GRADNOISE_EVERY = "TFCLUSTER_GRADNOISE_EVERY"  # k: the norms on every k-th step (default 8; 1: every step)
    PROFILER = "TFCLUSTER_PROFILER"
    PROFILE_DEBUG = "TFCLUSTER_PROFILE_DEBUG"
    PROGRESS_FD = "TFCLUSTER_PROGRESS_FD"
    DEBUG = "TFCLUSTER_DEBUG"  # launcher: show tracebacks of internal errors (like --debug)
    CONNECT = "TFCLUSTER_CONNECT"  # connect-back: the supervisor's HOST:PORT
    RANK = "TFCLUSTER_RANK"  # connect-back: which task this node is (0-based, in plan order)
    SLURM_NODE_ADDRS = "TFCLUSTER_SLURM_NODE_ADDRS"  # slurm: NAME=ADDR,... of the allocation's nodes (NodeAddr)
    GPU_SLOT = "TFCLUSTER_GPU_SLOT"  # slurm, a task restarted in place: LOCAL/TASKS_HERE, its share of the node's GPUs
    SECRET_ARG = "TFCLUSTER_SECRET_ARG"  # Kubernetes: _<i>: a credential word of the command, from the job's Secret
    POD = "TFCLUSTER_POD"  # Kubernetes: the pod's worker_entry settings (JSON, rendered into the pod spec)
    JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"  # Kubernetes: set by the Job controller (Indexed Jobs)
    CHECK_SECRET = "TFCLUSTER_CHECK_SECRET"  # tfcluster check: the probes' per-run secret (its NodeConfig env)
    SCALE_WORKERS = "TFCLUSTER_SCALE_WORKERS"  # tfcluster scale: the workers of this size of the sweep
    SCALE_BASE_WORKERS = "TFCLUSTER_SCALE_BASE_WORKERS"  # ... its smallest size (the baseline)
    SCALE_MODE = "TFCLUSTER_SCALE_MODE"  # ... weak (same per-worker batch) or strong (same global batch)
    PREFIX = "TFCLUSTER_"


#: The longest environment string execve takes (Linux MAX_ARG_STRLEN, 32 pages): ``NAME=VALUE`` and its NUL.
ENV_STRING_MAX = 128 << 10

#: Path variables worker_entry expands (``~``) on the node before starting the command.
PATH_VARS = (Env.CHECKPOINT_DIR, Env.BACKUP_DIR)
OFF_VALUES = ("0", "false", "no", "off")
