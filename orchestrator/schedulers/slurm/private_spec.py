"""The spec a submitted run's batch job runs, credentials included: a private file, not the job's environment.

Slurm keeps a batch job's environment for its lifetime (slurmctld's state files) and, where the site
stores it (``AccountingStoreFlags=job_env``), in its database for good (``sacct --env-vars``): no
place for ``job.env``'s tokens. The spec travels instead as ``RUN/slurm/private-spec.json``: 0600
under the 0700 run directory on the shared filesystem the batch job already needs — readable by the
user (and root), as the spec file itself is. Every allocation of the run reads it (a requeue needs
it again); the one that ends the run removes it. A missing, foreign or damaged file refuses the run
(recorded in result.json): the redacted copy ``spec.yaml`` would run with ``<redacted>`` as its
credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat

from ...core.errors import SpecError
from ...runs import RunDir, write_private
from ...spec import LoadedSpec, load_spec_text
from ...spec.load import MAX_SPEC_BYTES


class PrivateSpecMissing(Exception):
    """The batch job cannot run: the message says why and what to do."""


def write_private_spec(rundir: RunDir, loaded: LoadedSpec, command: list[str] | None) -> None:
    """RUN/slurm/private-spec.json: the spec's text, its file name and the ``launch -- COMMAND`` override."""
    data = json.dumps({"path": loaded.path, "text": loaded.text, "command": command})
    write_private(rundir.slurm_private_spec, data + "\n")


def read_private_spec(rundir: RunDir) -> LoadedSpec:
    """The spec ``write_private_spec`` left, validated again like any spec file; PrivateSpecMissing if it
    is not there, not a regular file of this user, or not what tfcluster wrote."""
    path = rundir.slurm_private_spec
    again = "submit the run again with `tfcluster launch` (this run directory cannot run without it)"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise PrivateSpecMissing(
            f"{path} is missing: the spec with its credentials is not there (removed, or the run was submitted by an "
            f"older tfcluster), and RUN/spec.yaml is the redacted copy; {again}"
        ) from None
    except OSError as exc:
        raise PrivateSpecMissing(f"{path}: cannot read it: {exc.strerror or exc}; {again}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PrivateSpecMissing(
                f"{path} is not a private file of uid {os.geteuid()} (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):o}); refusing to run what another user could have written; {again}"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(4 * MAX_SPEC_BYTES + 1)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or not isinstance(data.get("text"), str) or not isinstance(data.get("path"), str):
            raise ValueError("not the object tfcluster writes")
        loaded = load_spec_text(data["text"], data["path"])
    except (ValueError, SpecError) as exc:
        raise PrivateSpecMissing(f"{path} is damaged ({str(exc).splitlines()[0][:200]}); {again}") from None
    command = data.get("command")
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        job = loaded.spec.job.model_copy(update={"command": command})
        loaded = LoadedSpec(
            spec=loaded.spec.model_copy(update={"job": job}),
            path=loaded.path,
            text=loaded.text,
            warnings=loaded.warnings,
        )
    return loaded


def remove_private_spec(rundir: RunDir) -> None:
    """The run is over: its credentials do not stay in the run directory."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(rundir.slurm_private_spec)
