#!/usr/bin/env python3
"""Launch fan-out: time from `tfcluster launch` to every worker running, vs OpenSSH/pdsh/paramiko.

    python bench/launch_fanout.py [--quick] [--json] [--repeat N] [--sizes 1,4,16] [--profile]

On 1, 4 and 16 loopback test-bed hosts (one real sshd each, strict host-key checking), side by side
in one run, repeated with the order rotated (median reported):

* tfcluster: `python -m orchestrator launch SPEC -q --no-gather -- true`. "to running" = from the
  fork of the launcher to the last `task_spawned` event in its events.jsonl (every worker_entry has
  said hello, got its go and started `true`); "spawn phase" = `job_started` -> last `task_spawned`;
  "wall" = until the launcher exited. CPU = the launcher's own user+sys (os.wait4 rusage; it starts
  no local children), and the marginal CPU per extra host ((cpu(N) - cpu(1)) / (N - 1)).
* ssh loop: sequential `ssh -F CFG hostN true`; pdsh: `pdsh -R ssh -w ... true` with an ssh config
  (Port, IdentityFile, UserKnownHostsFile, StrictHostKeyChecking yes); paramiko pool: a Python
  process with one thread per host (connect, exec `true`, wait for its exit status); fabric
  ThreadingGroup when fabric is installed. CPU = that client process tree (ssh clients included).
* floors the box imposes: N login shells in parallel (`bash -c true` as sshd runs it, i.e. with
  SSH_CLIENT set, so bash sources ~/.bashrc), and N `python -m worker_entry --version` in parallel.

Every "remote" sshd, login shell and worker_entry runs on this machine's cores, next to the launcher.
Also the same paramiko pool running `python -m worker_entry --version` instead of `true`: the floor
of any launcher that starts Python on each node (`true` starts none).
The ratio printed last: tfcluster's whole command / the fastest peer's wall time for `true`, at the
largest size (target <= 1.0 up to 16 hosts, <= 1.2 beyond). The modules are byte-compiled first.
"""

from __future__ import annotations

import compileall
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    PY,
    Report,
    base_parser,
    detail,
    events,
    first_ts,
    last_ts,
    launcher_argv,
    launcher_env,
    median,
    run_measured,
    say,
    set_verbose,
    testbed,
    write_ssh_config,
)
from launch_costs import component_costs, local_login_shell_ms  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent

PARAMIKO_POOL = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import paramiko
a = json.loads(sys.argv[1])
def one(h):
    c = paramiko.SSHClient()
    c.load_host_keys(a["known_hosts"])
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(h[0], port=h[1], username=a["user"], key_filename=a["key"], look_for_keys=False,
              allow_agent=False, timeout=30)
    _, out, _ = c.exec_command(a["command"])
    rc = out.channel.recv_exit_status()
    c.close()
    return rc
with ThreadPoolExecutor(max_workers=len(a["hosts"])) as pool:
    rcs = list(pool.map(one, a["hosts"]))
sys.exit(max(rcs))
"""

FABRIC_GROUP = r"""
import json, sys
from fabric import Connection, ThreadingGroup
a = json.loads(sys.argv[1])
kw = {"key_filename": a["key"], "look_for_keys": False, "allow_agent": False}
conns = []
for host, port in a["hosts"]:
    c = Connection(host, user=a["user"], port=port, connect_kwargs=kw)
    c.client.load_host_keys(a["known_hosts"])
    import paramiko
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    conns.append(c)
g = ThreadingGroup.from_connections(conns)
r = g.run(a["command"], hide=True)
sys.exit(0 if all(x.ok for x in r.values()) else 1)
"""


POOL_PYTHON = "floor: paramiko pool + python"


def have_fabric() -> bool:
    try:
        import fabric  # noqa: F401
    except ImportError:
        return False
    return True


def run_tfcluster(tb, hosts, work: Path, tag: str, profile: Path | None = None, gather: bool = False) -> dict:
    n = len(hosts)
    spec = tb.spec_dict(f"fan{n}", ["true"], job={"remote_dir": str(tb.dir / "remote")})
    spec["hosts"] = spec["hosts"][:n]
    spec_path = work / f"spec-{n}.yaml"
    import yaml

    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_dir = work / f"run-{tag}"
    args = [
        "launch",
        str(spec_path),
        "--run-dir",
        str(run_dir),
        "-q",
        *([] if gather else ["--no-gather"]),
        "--",
        "true",
    ]
    if profile is not None:
        argv = tb.launcher_argv([PY, "-m", "cProfile", "-o", str(profile), "-m", "orchestrator", *args])
    else:
        argv = launcher_argv(tb, *args)
    m = run_measured(argv, env=launcher_env(), timeout=120)
    evs = events(run_dir)
    if m.rc != 0:
        raise RuntimeError(f"launch failed rc={m.rc}: {m.stderr[-2000:]}")
    started = first_ts(evs, "job_started")
    connected = first_ts(evs, "connected")
    ready_last = last_ts(evs, "task_ready")
    ready_first = first_ts(evs, "task_ready")
    spawned_first = first_ts(evs, "task_spawned")
    spawned_last = last_ts(evs, "task_spawned")
    n_spawned = sum(1 for e in evs if e["event"] == "task_spawned")
    if n_spawned != n:
        raise RuntimeError(f"{n_spawned} task_spawned events for {n} hosts")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "wall_s": m.wall_s,
        "to_running_s": spawned_last - m.t_start,
        "spawn_phase_s": spawned_last - started,
        "cpu_s": m.cpu_s,
        "box_cpu_s": m.box_cpu_s,
        "maxrss_mb": m.maxrss_mb,
        "phases": {
            "python start + imports + plan": started - m.t_start,
            "connect (parallel paramiko)": connected - started,
            "exec -> first hello": ready_first - connected,
            "exec -> last hello": ready_last - connected,
            "last hello -> first spawned (go)": spawned_first - ready_last,
            "first -> last spawned": spawned_last - spawned_first,
            "last spawned -> launcher exit": m.t_end - spawned_last,
        },
    }


def run_peer(kind: str, tb, hosts, work: Path, ssh_cfg: Path) -> dict:
    n = len(hosts)
    env = dict(os.environ)
    if kind == "ssh loop":
        script = work / f"loop-{n}.sh"
        script.write_text("set -e\n" + "".join(f"ssh -F {ssh_cfg} {h.name} true\n" for h in hosts))
        argv = ["bash", str(script)]
    elif kind == "pdsh":
        env["PDSH_SSH_ARGS"] = f"-F {ssh_cfg} -x -a %h"
        argv = ["pdsh", "-R", "ssh", "-f", str(max(n, 1)), "-w", ",".join(h.name for h in hosts), "true"]
    elif kind in ("paramiko pool", "fabric group", POOL_PYTHON):
        a = {
            "hosts": [[h.address, h.ssh_port] for h in hosts],
            "user": tb.user,
            "key": str(tb.user_key),
            "known_hosts": str(tb.known_hosts),
            # the floor of any launcher that runs Python on each node: the pool starting worker_entry
            # (this checkout's, as the launcher's job.python runs it: not whatever is installed on the host)
            "command": f"exec env PYTHONPATH={REPO_ROOT} {PY} -m worker_entry --version"
            if kind == POOL_PYTHON
            else "true",
        }
        code = FABRIC_GROUP if kind == "fabric group" else PARAMIKO_POOL
        argv = [PY, "-c", code, json.dumps(a)]
    elif kind == "floor: login shells":
        # What sshd runs for `true`: `bash -c true` with SSH_CLIENT set: Debian's bash then sources ~/.bashrc.
        env.update({"SSH_CLIENT": "127.0.0.1 40000 22", "SSH_CONNECTION": "127.0.0.1 40000 127.0.0.2 22"})
        env.pop("SHLVL", None)
        argv = ["bash", "--norc", "-c", f"for i in $(seq {n}); do bash -c true & done; wait"]
    elif kind == "floor: python worker_entry":
        argv = [
            "bash",
            "--norc",
            "-c",
            f"for i in $(seq {n}); do {PY} -m worker_entry --version >/dev/null & done; wait",
        ]
    elif kind == "floor: login shell + worker_entry":
        env.update({"SSH_CLIENT": "127.0.0.1 40000 22", "SSH_CONNECTION": "127.0.0.1 40000 127.0.0.2 22"})
        env.pop("SHLVL", None)
        inner = f"exec {PY} -m worker_entry --version >/dev/null"
        argv = ["bash", "--norc", "-c", f"for i in $(seq {n}); do bash -c {shlex.quote(inner)} & done; wait"]
    else:
        raise ValueError(kind)
    m = run_measured(argv, env=env, timeout=120, cwd=str(Path(__file__).resolve().parent.parent))
    if m.rc != 0:
        raise RuntimeError(f"{kind} failed rc={m.rc}: {m.stderr[-1500:]}")
    return {"wall_s": m.wall_s, "cpu_s": m.cpu_s, "to_running_s": m.wall_s, "box_cpu_s": m.box_cpu_s}


def main() -> int:
    ap = base_parser(__doc__)
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--profile", action="store_true", help="also run the launcher under cProfile at the largest size")
    args = ap.parse_args()
    set_verbose(args.verbose)
    sizes = [int(x) for x in args.sizes.split(",")]
    reps = args.repeat or (1 if args.quick else 3)
    methods = ["tfcluster", "tfcluster whole command", "ssh loop", "pdsh", "paramiko pool"]
    if have_fabric():
        methods.append("fabric group")
    floors = ["floor: login shells", "floor: python worker_entry", "floor: login shell + worker_entry", POOL_PYTHON]
    all_methods = methods + floors
    results: dict[tuple[str, int], list[dict]] = {}
    report = Report(
        "launch fan-out: launch to every worker running (loopback test bed, 1 sshd per host)",
        [
            ("method", "method"),
            ("hosts", "hosts"),
            ("to_running_s", "to running s"),
            ("spawn_phase_s", "spawn phase s"),
            ("wall_s", "wall s"),
            ("cpu_s", "client CPU s"),
            ("box_cpu_s", "box CPU s"),
            ("cpu_ms_per_host", "CPU ms/host"),
            ("marginal_cpu_ms_per_host", "marg. CPU ms/host"),
        ],
    )
    # Bytecode as an installed package has it: with PYTHONDONTWRITEBYTECODE set and a stale cache, the
    # launcher would compile every module it imports on every run.
    compileall.compile_dir(str(REPO_ROOT / "orchestrator"), quiet=1)
    compileall.compile_dir(str(REPO_ROOT / "worker_entry"), quiet=1)
    work = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    try:
        with testbed(max(sizes), mode="loopback") as tb:
            ssh_cfg = work / "ssh_config"
            write_ssh_config(tb, ssh_cfg)
            # warm-up: page cache, sshd first-connection paths, python bytecode
            run_peer("paramiko pool", tb, tb.hosts, work, ssh_cfg)
            run_tfcluster(tb, tb.hosts[:2], work, "warm")
            for rep in range(reps):
                for n in sizes:
                    k = (rep + sizes.index(n)) % len(all_methods)
                    order = all_methods[k:] + all_methods[:k]  # rotate: no method always first/last
                    for meth in order:
                        hosts = tb.hosts[:n]
                        if meth.startswith("tfcluster"):
                            r = run_tfcluster(tb, hosts, work, f"{n}-{rep}", gather=meth != "tfcluster")
                        else:
                            r = run_peer(meth, tb, hosts, work, ssh_cfg)
                        results.setdefault((meth, n), []).append(r)
                        detail(f"rep {rep} n={n} {meth}: {r.get('to_running_s'):.3f}s cpu {r['cpu_s']:.3f}s")
                say(f"repetition {rep + 1}/{reps} done")
            costs = component_costs(tb)
            prof_rows = []
            if args.profile:
                prof = work / "launch.prof"
                run_tfcluster(tb, tb.hosts, work, "prof", profile=prof)
                import pstats

                st = pstats.Stats(str(prof))
                total = st.total_tt
                for (fn, line, name), (_, nc, tt, ct, _) in sorted(
                    st.stats.items(), key=lambda kv: kv[1][2], reverse=True
                )[:15]:
                    prof_rows.append(
                        {
                            "function": f"{Path(fn).name}:{line} {name}",
                            "calls": nc,
                            "tottime_ms": 1000 * tt,
                            "cumtime_ms": 1000 * ct,
                        }
                    )
                report.notes.append(f"cProfile (main thread only) total {total:.3f}s")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cpu1 = median([r["cpu_s"] for r in results.get(("tfcluster", min(sizes)), [])])
    for meth in all_methods:
        for n in sizes:
            rs = results.get((meth, n), [])
            if not rs:
                continue
            cpu = median([r["cpu_s"] for r in rs])
            row = {
                "method": meth,
                "hosts": n,
                "to_running_s": median([r["to_running_s"] for r in rs]),
                "spawn_phase_s": median([r["spawn_phase_s"] for r in rs]) if meth.startswith("tfcluster") else None,
                "wall_s": median([r["wall_s"] for r in rs]),
                "cpu_s": cpu,
                "box_cpu_s": median([r["box_cpu_s"] for r in rs]),
                "cpu_ms_per_host": 1000 * cpu / n,
                "marginal_cpu_ms_per_host": None,
            }
            if meth.startswith("tfcluster") and n > min(sizes):
                base = median([r["cpu_s"] for r in results.get((meth, min(sizes)), [])]) or cpu1
                row["marginal_cpu_ms_per_host"] = 1000 * (cpu - base) / (n - min(sizes))
            report.rows.append(row)
    N = max(sizes)
    tf_runs = results[("tfcluster", N)]
    phases = {k: median([r["phases"][k] for r in tf_runs]) for k in tf_runs[0]["phases"]}
    report.extra_tables.append(
        (
            f"tfcluster phases at {N} hosts (median of {len(tf_runs)}; from events.jsonl)",
            [("phase", "phase"), ("s", "seconds")],
            [{"phase": k, "s": v} for k, v in phases.items()],
        )
    )
    report.extra_tables.append(
        ("single-host component costs (sequential, median of 5)", [("what", "what"), ("ms", "ms")], costs)
    )
    if prof_rows:
        report.extra_tables.append(
            (
                f"launcher cProfile at {N} hosts, top 15 by own time (main thread only)",
                [("function", "function"), ("calls", "calls"), ("tottime_ms", "own ms"), ("cumtime_ms", "cum ms")],
                prof_rows,
            )
        )
    report.data = {
        "raw": {f"{m}@{n}": v for (m, n), v in results.items()},
        "phases": phases,
        "repetitions": reps,
    }
    peers = [m for m in methods if not m.startswith("tfcluster")]
    best_peer = min(peers, key=lambda m: median([r["wall_s"] for r in results[(m, N)]]))
    peer_wall = median([r["wall_s"] for r in results[(best_peer, N)]])
    ours = median([r["to_running_s"] for r in tf_runs])
    whole_runs = results[("tfcluster whole command", N)]
    whole = median([r["wall_s"] for r in whole_runs])
    ours_cpu_marg = next(
        r["marginal_cpu_ms_per_host"]
        for r in report.rows
        if r["method"] == "tfcluster whole command" and r["hosts"] == N
    )
    report.notes.append(
        f"median of {reps} repetition(s), order rotated; fastest peer at {N} hosts: {best_peer} ({peer_wall:.2f}s); "
        f"tfcluster to running {ours:.2f}s; whole command (launch, run `true`, gather, exit) {whole:.2f}s"
    )
    report.notes.append(
        f"launcher CPU at {N} hosts, whole command: {1000 * median([r['cpu_s'] for r in whole_runs]) / N:.0f} ms/host "
        f"all-in, {ours_cpu_marg if ours_cpu_marg is not None else float('nan'):.0f} ms/host marginal (target <= 30 ms/host)"
    )
    floor = median([r["wall_s"] for r in results[("floor: login shell + worker_entry", N)]])
    report.notes.append(
        f"the box's floor at {N} hosts (login shells + worker_entry Pythons in parallel): {floor:.2f}s; "
        f"{best_peer} / floor = {peer_wall / floor:.2f}"
    )
    pool_py = median([r["wall_s"] for r in results[(POOL_PYTHON, N)]])
    report.notes.append(
        f"the same paramiko pool running `python -m worker_entry --version` instead of `true` (the Python every "
        f"node needs, which `true` does not start): {pool_py:.2f}s; tfcluster whole command / that = "
        f"{whole / pool_py:.2f}"
    )
    report.notes.append(f"launch to all running vs {best_peer}: {peer_wall / ours:.3f}")
    target = 1.0 if N <= 16 else 1.2
    ratio = whole / peer_wall
    report.set_ratio(f"tfcluster whole command / {best_peer} wall at {N} hosts", ratio, f"<= {target}", ratio <= target)
    report.emit(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
