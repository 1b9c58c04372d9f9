"""A node that breaks the protocol, over real SSH: that task fails with "protocol error from HOST",
the job tears down cleanly, result.json is written, and nothing is left on any host."""

from __future__ import annotations

import stat

import pytest
from conftest import PY, WORKLOADS, assert_no_job_processes, run_launch

from tfcluster_testbed import MARKER_ENV

pytestmark = pytest.mark.e2e

LONG = [PY, "-c", "import time\nfor i in range(600): print(i, flush=True); time.sleep(0.1)"]


def _wrapper(tb, tmp_path, host, *filter_args: str):
    """job.python for every host: the real interpreter, except on `host`, where worker_entry's output
    goes through a filter that injects a malformed message."""
    script = tmp_path / "python-wrapper"
    args = " ".join(filter_args)
    script.write_text(
        "#!/bin/bash\n"
        f'if [ "${MARKER_ENV}" = "{tb.marker(host)}" ]; then\n'
        f'  "{PY}" "$@" | "{PY}" "{WORKLOADS / "corrupting_filter.py"}" {args}\n'
        "  exit ${PIPESTATUS[1]}\n"
        "fi\n"
        f'exec "{PY}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize(("when", "rc", "state"), [("after-go", 3, "failed"), ("before-go", 4, "start_failed")])
def test_a_malformed_message_over_ssh_fails_that_task_and_nothing_is_left(testbed_factory, tmp_path, when, rc, state):
    tb = testbed_factory(3)
    python = _wrapper(tb, tmp_path, tb.hosts[1], *(["--before-go"] if when == "before-go" else []))
    spec = tb.write_spec(tmp_path / "spec.yaml", "hostile", LONG, job={"python": python})
    r = run_launch(tb, spec, tmp_path / "run")
    assert r.rc == rc, r.stderr[-3000:]
    result = r.result
    assert result["state"] == state
    root = result["root_cause"]
    assert root["kind"] == "protocol" and root["task"] == "worker:1"
    assert root["message"].startswith(f"protocol error from {tb.hosts[1].address}: heartbeat.seq: expected an integer")
    assert f"protocol error from {tb.hosts[1].address}" in r.stderr
    assert_no_job_processes(tb, 10)
