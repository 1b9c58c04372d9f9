#!/usr/bin/env python3
"""Failure detection and teardown: a real 3-worker MWMS job, one fault, until nothing is left.

    python bench/failure_detection.py [--quick] [--json] [--cap 60] [--faults kill,stop,cut]

Needs root (network-namespace test bed: every host its own namespace, address and sshd; the
launcher in the controller namespace). Job: tests/workloads/mwms_job.py --epochs 1000 --steps 50,
heartbeat interval 0.5 s, timeout 5 s. Once every worker is past its first epoch, one fault:

* kill: SIGKILL of worker:1's training process;
* stop: SIGSTOP of worker:2's training process (a hung worker);
* cut:  host2's link taken down (`ip link set eth0 down` in its namespace).

tfcluster: time from the fault until the launcher has exited AND no process of the job is left on
any host (the test bed's view: every process in each host namespace, sshd's own processes and
zombies ignored), plus when the launcher's first verdict/teardown event came.
By hand: the same job started with the TF_CONFIGs built from `tfcluster plan --json` (its cluster), as plain processes in
the host namespaces (no tfcluster); time until the surviving workers exit, and until every process
is gone, up to --cap seconds (then the benchmark kills them itself).

Targets: SIGKILL -> everything gone <= 1.5 s; stop or cut -> <= heartbeat timeout + 2 s = 7 s.
Ratio printed last: the smallest, over the faults, of (by hand: every process gone, capped) /
(tfcluster: every process gone): how much sooner tfcluster leaves a clean cluster, worst case.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PY,
    REPO,
    Report,
    base_parser,
    events,
    job_processes,
    launcher_env,
    say,
    set_verbose,
    testbed,
    wait_for,
)

from tfcluster_testbed import MARKER_ENV, netns_available
from worker_entry.protocol.cluster import tf_config

INTERVAL = 0.5
TIMEOUT = 5.0
WORKLOAD = REPO / "tests" / "workloads" / "mwms_job.py"
TARGETS = {"kill": 1.5, "stop": TIMEOUT + 2, "cut": TIMEOUT + 2}
FAULT_HOST = {"kill": 1, "stop": 2, "cut": 2}


def job_argv(pid_dir: Path) -> list[str]:
    return [PY, str(WORKLOAD), "--epochs", "1000", "--steps", "50", "--pid-dir", str(pid_dir)]


def write_spec(tb, work: Path, name: str, pid_dir: Path) -> Path:
    return tb.write_spec(
        work / f"{name}.yaml",
        name,
        job_argv(pid_dir),
        heartbeat={"interval_s": INTERVAL, "timeout_s": TIMEOUT},
        job={"remote_dir": str(tb.dir / "remote")},
    )


def past_first_epoch(texts: list[str]) -> bool:
    return len(texts) == 3 and all("epoch 1 begins" in t for t in texts)


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def inject(tb, fault: str, pids: dict[str, int]) -> None:
    i = FAULT_HOST[fault]
    if fault == "kill":
        os.kill(pids[f"worker:{i}"], signal.SIGKILL)
    elif fault == "stop":
        os.kill(pids[f"worker:{i}"], signal.SIGSTOP)
    else:
        tb.cut(tb.hosts[i])


def undo(tb, fault: str, pids: dict[str, int]) -> None:
    i = FAULT_HOST[fault]
    if fault == "stop":
        try:
            os.kill(pids[f"worker:{i}"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    elif fault == "cut":
        tb.restore(tb.hosts[i])


def read_pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem.replace("-", ":"): int(p.read_text()) for p in pid_dir.glob("*.pid") if p.read_text().strip()}


def trial_tfcluster(tb, work: Path, fault: str, cap: float) -> dict:
    name = f"fd-{fault}"
    pid_dir = work / f"{name}-pids"
    pid_dir.mkdir()
    spec = write_spec(tb, work, name, pid_dir)
    run_dir = work / f"{name}-run"
    out = open(work / f"{name}.launcher.log", "wb")  # noqa: SIM115
    proc = tb.run_on_controller(
        [PY, "-m", "orchestrator", "launch", str(spec), "--run-dir", str(run_dir), "-q", "--no-gather"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=launcher_env(),
        cwd=str(REPO),
    )
    logs = [run_dir / "logs" / f"worker-{i}.log" for i in range(3)]
    wait_for(
        lambda: past_first_epoch([read(p) for p in logs]) or proc.poll() is not None,
        240,
        f"the tfcluster job's workers past their first epoch (launcher log {work / f'{name}.launcher.log'})",
        interval=0.2,
    )
    if proc.poll() is not None:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"tfcluster job did not start training: {read(work / f'{name}.launcher.log')[-2000:]}")
    pids = read_pids(pid_dir)
    t_fault_wall = time.time()
    t0 = time.monotonic()
    inject(tb, fault, pids)
    t_exit = t_gone = None
    host_gone: dict[str, float] = {}
    try:
        while time.monotonic() - t0 < cap:
            if t_exit is None and proc.poll() is not None:
                t_exit = time.monotonic() - t0
            left = job_processes(tb)
            now = time.monotonic() - t0
            for h in tb.hosts:
                if h.name in left:
                    host_gone.pop(h.name, None)
                else:
                    host_gone.setdefault(h.name, now)
            if t_exit is not None and not left:
                t_gone = now
                break
            time.sleep(0.02)
    finally:
        undo(tb, fault, pids)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        out.close()
    evs = events(run_dir)
    verdict = next(
        (
            e
            for e in evs
            if e["event"] in ("worker_lost", "worker_hung", "task_lost", "teardown") and e["ts"] >= t_fault_wall
        ),
        None,
    )
    result = json.loads(read(run_dir / "result.json") or "{}")
    rc = result.get("root_cause") or {}
    timeline = [
        f"{e['ts'] - t_fault_wall:+.2f} {e['event']}{' ' + e['task'] if e.get('task') else ''}"
        for e in evs
        if e["ts"] >= t_fault_wall - 0.5
        and e["event"] in ("worker_lost", "worker_hung", "task_lost", "teardown", "task_exited", "job_finished")
    ]
    timeline.append(
        "hosts empty at: "
        + ", ".join(f"{k} {v:+.2f}" for k, v in sorted(host_gone.items()))
        + f"; launcher exited {t_exit:+.2f}"
        if t_exit is not None
        else ""
    )
    return {
        "timeline": timeline,
        "fault": fault,
        "method": "tfcluster",
        "first_verdict_s": (verdict["ts"] - t_fault_wall) if verdict else None,
        "verdict": f"{verdict['event']}" if verdict else None,
        "launcher_exit_s": t_exit,
        "survivors_exit_s": t_exit,
        "all_gone_s": t_gone,
        "root_cause": f"{rc.get('task')} {rc.get('kind')}" if rc else None,
        "exit_code": proc.returncode,
    }


def hand_env(tb, h, tf_config: dict) -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CONFIG"] = json.dumps(tf_config)
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    env[MARKER_ENV] = tb.marker(h)
    return env


def trial_hand(tb, work: Path, fault: str, cap: float, tf_configs: list[dict]) -> dict:
    name = f"hand-{fault}"
    pid_dir = work / f"{name}-pids"
    pid_dir.mkdir()
    procs, logs, files = [], [], []
    for i, h in enumerate(tb.hosts):
        log = work / f"{name}-{i}.log"
        f = open(log, "wb")  # noqa: SIM115
        files.append(f)
        logs.append(log)
        inner = f'hostname {shlex.quote(h.hostname)} && exec "$@"'
        argv = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--", "sh", "-c", inner, "sh", *job_argv(pid_dir)]
        procs.append(
            subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=hand_env(tb, h, tf_configs[i])
            )
        )
    try:
        wait_for(
            lambda: past_first_epoch([read(p) for p in logs]) or any(p.poll() is not None for p in procs),
            240,
            "the hand-started workers past their first epoch",
            interval=0.2,
        )
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"hand-started job did not train: {[read(p)[-500:] for p in logs]}")
        pids = read_pids(pid_dir)
        i_fault = FAULT_HOST[fault]
        survivors = [p for i, p in enumerate(procs) if i != i_fault]
        t0 = time.monotonic()
        inject(tb, fault, pids)
        t_surv = t_gone = t_first = None
        codes = {}
        try:
            while time.monotonic() - t0 < cap:
                for i, p in enumerate(procs):
                    if i not in codes and p.poll() is not None:
                        codes[i] = p.returncode
                        if i != i_fault and t_first is None:
                            t_first = time.monotonic() - t0
                if t_surv is None and all(p.poll() is not None for p in survivors):
                    t_surv = time.monotonic() - t0
                if t_surv is not None and not job_processes(tb):
                    t_gone = time.monotonic() - t0
                    break
                time.sleep(0.02)
        finally:
            undo(tb, fault, pids)
        alive = [f"worker:{i}" for i, p in enumerate(procs) if p.poll() is None]
        return {
            "fault": fault,
            "method": "by hand (TF_CONFIG)",
            "first_verdict_s": t_first,
            "verdict": "first survivor exited" if t_first is not None else None,
            "launcher_exit_s": None,
            "survivors_exit_s": t_surv,
            "all_gone_s": t_gone,
            "root_cause": None,
            "exit_code": None,
            "alive_at_cap": alive if t_gone is None else [],
            "survivor_codes": {f"worker:{i}": c for i, c in codes.items()},
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for f in files:
            f.close()
        wait_for(lambda: not job_processes(tb), 15, "every process of the hand-started job gone", interval=0.1)


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--cap", type=float, default=None, help="give up on the by-hand survivors after this (s)")
    ap.add_argument("--faults", default="kill,stop,cut")
    args = ap.parse_args()
    set_verbose(args.verbose)
    if not netns_available():
        print("failure_detection needs root and `ip netns` (network-namespace test bed)", file=sys.stderr)
        return 2
    cap = args.cap or (25.0 if args.quick else 60.0)
    faults = args.faults.split(",")
    report = Report(
        "failure detection: fault -> every process of the job gone (netns test bed, 3 MWMS workers)",
        [
            ("fault", "fault"),
            ("method", "method"),
            ("first_verdict_s", "first verdict s"),
            ("survivors_exit_s", "survivors exited s"),
            ("all_gone_s", "all gone s"),
            ("target_s", "target s"),
            ("ok", "within target"),
            ("detail", "detail"),
        ],
    )
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as wd, testbed(3, mode="netns") as tb:
        work = Path(wd)
        os.chmod(work, 0o755)
        spec = write_spec(tb, work, "plan-only", work)
        plan = subprocess.run(
            [PY, "-m", "orchestrator", "plan", str(spec), "--json"],
            capture_output=True,
            text=True,
            env=launcher_env(),
            cwd=str(REPO),
            check=True,
        )
        record = json.loads(plan.stdout)  # the plan record: the cluster once, each task's TF_CONFIG from it
        tasks = [t["task"].partition(":") for t in record["tasks"]]
        tf_configs = [tf_config(record["cluster"], kind, int(index)) for kind, _, index in tasks]
        for fault in faults:
            for method in ("tfcluster", "hand"):
                say(f"{fault}: {method} ...")
                if method == "tfcluster":
                    r = trial_tfcluster(tb, work, fault, cap)
                else:
                    r = trial_hand(tb, work, fault, cap, tf_configs)
                raw.append(r)
                say(f"{fault}: {method}: all gone {r['all_gone_s']}, survivors {r['survivors_exit_s']}")
    ratios = []
    for r in raw:
        target = TARGETS[r["fault"]]
        row = dict(r)
        row["target_s"] = target if r["method"] == "tfcluster" else None
        if r["method"] == "tfcluster":
            row["ok"] = "yes" if r["all_gone_s"] is not None and r["all_gone_s"] <= target else "NO"
            row["detail"] = f"{r['verdict']}; root cause {r['root_cause']}; exit {r['exit_code']}"
        else:
            row["ok"] = None
            if r["all_gone_s"] is None:
                row["all_gone_s"] = None
                row["detail"] = f"still alive at {cap:g}s cap: {', '.join(r['alive_at_cap']) or '-'}"
            else:
                row["detail"] = f"exit codes {r['survivor_codes']}"
            if r["survivors_exit_s"] is None:
                row["detail"] += "; survivors hung"
        report.rows.append(row)
    for fault in faults:
        ours = next(r for r in raw if r["fault"] == fault and r["method"] == "tfcluster")
        hand = next(r for r in raw if r["fault"] == fault and r["method"] != "tfcluster")
        if ours["all_gone_s"]:
            ratios.append((hand["all_gone_s"] or cap) / ours["all_gone_s"])
    passed = all(
        r["all_gone_s"] is not None and r["all_gone_s"] <= TARGETS[r["fault"]]
        for r in raw
        if r["method"] == "tfcluster"
    )
    report.notes.append(
        f"heartbeat interval {INTERVAL}s, timeout {TIMEOUT}s; by-hand runs capped at {cap:g}s (then killed by the "
        "benchmark); 'all gone' = launcher exited and no job process on any host (sshd and zombies ignored)"
    )
    report.notes.append("one trial per fault and method (each needs a fresh TensorFlow start, ~15-30 s on 2 cores)")
    for r in raw:
        if r.get("timeline"):
            report.extra_tables.append(
                (
                    f"tfcluster events after the {r['fault']} fault (s, from events.jsonl)",
                    [("e", "event")],
                    [{"e": t} for t in r["timeline"]],
                )
            )
    report.data = {"raw": raw, "cap_s": cap}
    ratio = min(ratios) if ratios else None
    report.set_ratio(
        "min over faults of by-hand all-gone (capped) / tfcluster all-gone",
        ratio,
        "> 1, and every tfcluster row within its target (SIGKILL <= 1.5 s, stop/cut <= 7 s)",
        passed and ratio is not None and ratio > 1,
    )
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
