"""Another user's links and directories in a shared scratch, over real SSH (issue 31, item 7).

The test bed's nodes run as root; "another user" is uid 54321 (``os.chown``; no account needed). The
scratch is a sticky, world-writable directory like /tmp. Before the fix the task followed a planted
``output.log -> victim`` (truncating the victim and writing its output into it). Now worker_entry
refuses a task or backup directory on a path that user controls, before the go: the job does not
start (preflight_failed), its message names the component, its owner and the fix, the victim is untouched,
and nothing is left on any host. A scratch nobody planted in works as before, its directories 0700.
"""

from __future__ import annotations

import os
import stat

import pytest
from conftest import PY, assert_no_job_processes, repo_python, run_launch

pytestmark = pytest.mark.e2e

OTHER = 54321
SHORT = [PY, "-c", "print('trained', flush=True)"]


def _scratch(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o1777)  # like /tmp: anyone may create entries, only their owner remove them
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("do not touch\n")
    return scratch, victim


def _other_users(path, mode=0o777):
    os.chown(path, OTHER, OTHER, follow_symlinks=False)
    if not os.path.islink(path):
        os.chmod(path, mode)


def _launch(tb, tmp_path, name, **sections):
    spec = tb.write_spec(tmp_path / f"{name}.yaml", name, SHORT, **sections)
    return run_launch(tb, spec, tmp_path / f"run-{name}")


@pytest.fixture
def bed(testbed_factory):
    return testbed_factory(2)


def test_a_task_directory_under_another_users_directory_is_refused(bed, tmp_path):
    scratch, victim = _scratch(tmp_path)
    theirs = scratch / "tfc"
    theirs.mkdir()
    _other_users(theirs)  # they made the directory job.remote_dir names, and can plant anything in it
    r = _launch(bed, tmp_path, "planted", job={"python": repo_python(tmp_path), "remote_dir": str(theirs)})
    assert r.rc == 4 and r.result["state"] == "preflight_failed", r.stderr[-3000:]
    assert f"{theirs} belongs to uid {OTHER}" in r.stderr, r.stderr[-3000:]
    assert "fix: set job.remote_dir to a directory only you can write" in r.stderr
    assert list(theirs.iterdir()) == []  # nothing created under it
    assert (victim / "precious").read_text() == "do not touch\n"
    assert_no_job_processes(bed, 10)


def test_a_link_planted_as_the_task_directory_is_not_followed(bed, tmp_path):
    scratch, victim = _scratch(tmp_path)
    link = scratch / "tfc"
    link.symlink_to(victim)
    _other_users(link)
    r = _launch(bed, tmp_path, "linked", job={"python": repo_python(tmp_path), "remote_dir": str(link)})
    assert r.rc == 4 and r.result["state"] == "preflight_failed", r.stderr[-3000:]
    assert f"{link} is a symbolic link made by uid {OTHER}: not followed" in r.stderr, r.stderr[-3000:]
    assert sorted(x.name for x in victim.iterdir()) == ["precious"]
    assert_no_job_processes(bed, 10)


def test_a_backup_directory_planted_as_a_link_is_refused(bed, tmp_path):
    scratch, victim = _scratch(tmp_path)
    backup = scratch / "backup"
    backup.symlink_to(victim)
    _other_users(backup)
    r = _launch(
        bed,
        tmp_path,
        "backup",
        job={"python": repo_python(tmp_path), "remote_dir": str(scratch / "mine")},
        restart={"backup_dir": str(backup)},
    )
    assert r.rc == 4 and r.result["state"] == "preflight_failed", r.stderr[-3000:]
    assert f"backup directory {backup}: {backup} is a symbolic link made by uid {OTHER}" in r.stderr
    assert sorted(x.name for x in victim.iterdir()) == ["precious"]
    assert_no_job_processes(bed, 10)


def test_a_clean_shared_scratch_works_and_the_task_directories_are_private(bed, tmp_path):
    scratch, _ = _scratch(tmp_path)
    r = _launch(
        bed,
        tmp_path,
        "clean",
        job={"python": repo_python(tmp_path), "remote_dir": str(scratch / "tfc")},
        restart={"backup_dir": str(scratch / "backup")},
    )
    assert r.rc == 0, r.stderr[-3000:]
    logs = list((scratch / "tfc").rglob("output.log"))
    assert len(logs) == 2 and all(x.read_text() == "trained\n" for x in logs)
    for d in [scratch / "tfc", *(x.parent for x in logs), scratch / "backup"]:
        st = d.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), d
    assert_no_job_processes(bed, 10)
