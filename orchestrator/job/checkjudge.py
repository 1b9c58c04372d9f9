"""`tfcluster check`'s judgement (pure): every node's figures → check.json's tables and the named findings.

Relative, like the reference tools (DLRover's network check scores against the median; nccl-tests
reports algbw and busbw): a host is slow when its matmul rate is below ``HOST_SCORE_MIN`` x the median
host's; a host's network is slow when its *best* link is below ``LINK_RATIO_MIN`` x the median host's
best link (a host with one good link has a good NIC: the pairing rounds give every host two partners
where there are three hosts or more, so a slow link is pinned to the host all of whose links are
slow). A slow host whose links are slow too is named once, as a slow host (a CPU-starved host also
moves fewer bytes): that is how a slow link is told from a slow host. A link below ``LINK_RATIO_MIN``
x the median link whose two ends are both fine is named as a link. With two hosts a slow link cannot
be pinned to either: its figures are reported, not judged.

A node may lie (docs/security.md): its figures reach the judgement only validated and limited to its
own (``checkclaims``), and no single node's claim can get another host named. A link's figure is its
client's, held to what its server timed of the same transfer (``corroborated_links``); a host is named
for its links only when two partners measured it; compute is judged against the median of three hosts
or more (one inflated figure cannot move it past an honest host), and two hosts that differ are named
as the pair, which ``check.without_named_hosts`` refuses to act on.

All-reduce figures follow nccl-tests (doc/PERFORMANCE.md): ``algbw = S / t`` and, for all-reduce,
``busbw = algbw * 2(n-1)/n`` (n: the ranks in the collective), S the bytes per rank.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from . import checklag

HOST_SCORE_MIN = 0.5
LINK_RATIO_MIN = 0.25

#: finding codes (docs/events.md, `check_finding`; README "Checking a cluster")
SLOW_HOST = "slow_host"
SLOW_GPU = "slow_gpu"
SLOW_LINK = "slow_link"
NO_RESULT = "no_result"
BAD_CLAIM = "bad_claim"
#: a client's link figure may exceed its server's own view of the upload by this much (timing noise)
SERVED_TOLERANCE = 1.5


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n (1 for a single rank: nothing moves)."""
    return 2 * (n - 1) / n if n > 1 else 1.0


def _gbps(x: float) -> str:
    return f"{x / 1e9:.3g} GB/s" if x >= 1e8 else f"{x / 1e6:.3g} MB/s"


def _finding(
    code: str, what: str, subject: str, figure: float | None, median: float | None, task: str | None
) -> dict[str, Any]:
    return {"code": code, "what": what, "subject": subject, "figure": figure, "median": median, "task": task}


def judge(
    results: Mapping[str, Mapping[str, Any]],
    hosts: Mapping[str, str],
    phases: Mapping[str, str | None] | None = None,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """check.json from each task's verified figures (``results``, by task: ``checkclaims.node_result``)
    and each task's host (``hosts``, by task, in rank order: every task of the plan, also those that
    sent nothing). One node's figures cannot get another host named: a link counts for its partner
    only as far as the partner's own view confirms it (``corroborated_links``), a host is named for
    its links only when two partners measured it, and for its compute only against the median of
    three hosts or more (with two, the pair is named: the check cannot tell which one is off). ``phases``:
    each task's last reported phase; of the tasks without figures, those that did not reach the phase most
    tasks reached are named as the ones the others waited for, and the others are listed as ``waited``
    (``checklag``); ``deadline_s``: the check's, for the text."""
    findings: list[dict[str, Any]] = []
    done = [t for t, r in results.items() if r.get("gflops") is not None and not r.get("error")]
    ref, late = checklag.behind(phases or {}, list(hosts), done)
    if not any(t not in done and t not in late for t in hosts):
        ref = None  # nobody without figures waited for the late ones: each is named for its own reason
    waited: list[dict[str, Any]] = []
    for task, host in hosts.items():
        r = results.get(task)
        if r is None or r.get("error") or r.get("gflops") is None:
            why = (r or {}).get(
                "error"
            ) or "no result from this task (it did not start, was stopped with the others, or its check failed)"
            last = (phases or {}).get(task)
            if ref is not None and task not in late:
                waited.append({"task": task, "host": host, "phase": last, "error": why})
                continue
            what = f"no figures from {host} ({task}): {why}"
            if ref is not None:
                what = checklag.late_what(host, task, last, ref, deadline_s, len(hosts) - len(late)) + f"; {why}"
            findings.append(_finding(NO_RESULT, what, host, None, None, task))
        elif r.get("ignored"):
            what = f"{host} ({task}) claimed what it cannot know, ignored: " + "; ".join(r["ignored"][:3])
            findings.append(_finding(BAD_CLAIM, what, host, None, None, task))
    links = corroborated_links(results, hosts)
    # a link counts for both ends when the server's own view confirms it, else for its client only
    best: dict[str, float] = {}
    partners: dict[str, set[str]] = {}
    for link in links:
        for t, other in ((link["task_a"], link["task_b"]), (link["task_b"], link["task_a"])):
            if t == link["task_a"] or link["confirmed"]:
                best[t] = max(best.get(t, 0.0), link["bandwidth_Bps"])
                partners.setdefault(t, set()).add(other)
    # --- hosts: the matmul rate against the median host -------------------------------------------
    rated = {t: float(r["gflops"]) for t, r in results.items() if r.get("gflops") is not None and not r.get("error")}
    median_gflops = statistics.median(rated.values()) if rated else None
    median_best = statistics.median(best.values()) if best else None
    rows = []
    for task, host in hosts.items():
        r = results.get(task) or {}
        g = rated.get(task)
        score = g / median_gflops if g is not None and median_gflops else None
        rows.append(
            {
                "task": task,
                "host": host,
                "gflops": g,
                "score": score,
                "device": r.get("device"),
                "gpus": r.get("gpus") or [],
                "best_link_Bps": best.get(task),
                "hostname": r.get("hostname"),
            }
        )
    slow_hosts = set()
    if len(rated) == 2:
        findings += _uneven_pair(rows, hosts)
    for row in rows:
        if row["score"] is None or row["score"] >= HOST_SCORE_MIN or len(rated) < 3:
            continue
        slow_hosts.add(row["task"])
        gpu = row["device"] == "GPU"
        what = (
            f"slow {'GPU' if gpu else 'host'}: {row['host']} ({row['task']}): {row['gflops']:.3g} GFLOP/s "
            f"{'on its slowest GPU' if gpu else 'on its CPU'}, {row['score']:.2f}x the median host ({median_gflops:.3g} GFLOP/s)"
        )
        b = best.get(row["task"])
        if b is not None and median_best and len(best) > 2 and b < LINK_RATIO_MIN * median_best:
            what += (
                f"; its links are slow too ({_gbps(b)} at best, median {_gbps(median_best)}): the host, not the network"
            )
        subject = row["host"]
        if gpu and row["gpus"]:
            slowest = min(row["gpus"], key=lambda x: x.get("gflops", 0.0))
            subject = f"{row['host']} {slowest.get('device')}"
        findings.append(
            _finding(SLOW_GPU if gpu else SLOW_HOST, what, subject, row["gflops"], median_gflops, row["task"])
        )
    # --- links: a host whose every link is slow; then a slow link between two fine hosts -----------
    named_links = set()
    if median_best and len(best) > 2:
        for task, b in best.items():
            if task in slow_hosts or b >= LINK_RATIO_MIN * median_best or len(partners.get(task, ())) < 2:
                continue  # one partner alone cannot pin a slow link on a host (it may be the partner, or lie)
            mine = [x for x in links if task in (x["task_a"], x["task_b"])]
            worst = min(mine, key=lambda x: x["bandwidth_Bps"])
            named_links.update(id(x) for x in mine)
            row = next(r for r in rows if r["task"] == task)
            compute = f"; its compute is normal ({row['score']:.2f}x the median)" if row["score"] is not None else ""
            what = (
                f"slow link: {hosts.get(task, task)} ({task}): every link of it is slow, {_gbps(b)} at best "
                f"({worst['a']}<->{worst['b']}: {_gbps(worst['bandwidth_Bps'])}), median host's best link {_gbps(median_best)}{compute}"
            )
            findings.append(_finding(SLOW_LINK, what, hosts.get(task, task), b, median_best, task))
    confirmed = [x for x in links if x["confirmed"]]
    median_link = statistics.median(x["bandwidth_Bps"] for x in confirmed) if confirmed else None
    if median_link and len(confirmed) > 2:
        for x in confirmed:
            ends_fine = x["task_a"] not in slow_hosts and x["task_b"] not in slow_hosts
            if id(x) not in named_links and ends_fine and x["bandwidth_Bps"] < LINK_RATIO_MIN * median_link:
                what = f"slow link: {x['a']}<->{x['b']}: {_gbps(x['bandwidth_Bps'])}, median link {_gbps(median_link)}; both hosts are fine elsewhere"
                findings.append(
                    _finding(SLOW_LINK, what, f"{x['a']}<->{x['b']}", x["bandwidth_Bps"], median_link, None)
                )
    return {
        "hosts": rows,
        "allreduce": allreduce_rows(results, len(hosts)),
        "links": [{k: v for k, v in x.items()} for x in links],
        "network": network(links),
        "findings": findings,
        "thresholds": {"host_score_min": HOST_SCORE_MIN, "link_ratio_min": LINK_RATIO_MIN},
        "waited": waited,
    }


def corroborated_links(results: Mapping[str, Mapping[str, Any]], hosts: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every link its client measured, held to its server's own view of the upload: the figure is at
    most ``SERVED_TOLERANCE`` x what the server timed (``confirmed``), so a client cannot inflate a
    link beyond what its partner saw; a link no server view confirms is ``confirmed: False``."""
    served: dict[tuple[str, str, int], float] = {}
    for r in results.values():
        for s in r.get("served") or []:
            key = (str(s["a"]), str(s["b"]), int(s.get("round") or 1))
            served[key] = min(served.get(key, float("inf")), float(s["up_Bps"]))
    links = []
    for r in results.values():
        for link in r.get("links") or []:
            a, b, rnd = str(link["a"]), str(link["b"]), int(link.get("round") or 1)
            claim = float(link["bandwidth_Bps"])
            seen = served.get((a, b, rnd))
            links.append(
                {
                    "a": hosts.get(a, a),
                    "b": hosts.get(b, b),
                    "task_a": a,
                    "task_b": b,
                    "round": rnd,
                    "latency_s": float(link["latency_s"]),
                    "bandwidth_Bps": claim if seen is None else min(claim, SERVED_TOLERANCE * seen),
                    "up_Bps": link.get("up_Bps"),
                    "down_Bps": link.get("down_Bps"),
                    "confirmed": seen is not None,
                }
            )
    links.sort(key=lambda x: (x["round"], x["task_a"], x["task_b"]))
    return links


def _uneven_pair(rows: list[dict[str, Any]], hosts: Mapping[str, str]) -> list[dict[str, Any]]:
    """Two hosts whose compute differs beyond the tolerance, named as the pair: with two, the check
    cannot tell a slow host from a node that overstates its own figure."""
    low, high = sorted((r for r in rows if r["gflops"] is not None), key=lambda r: r["gflops"])
    if high["gflops"] <= 0 or low["gflops"] >= HOST_SCORE_MIN * high["gflops"]:
        return []
    what = (
        f"uneven hosts: {low['host']} ({low['task']}) {low['gflops']:.3g} GFLOP/s, {high['host']} ({high['task']}) "
        f"{high['gflops']:.3g} GFLOP/s ({low['gflops'] / high['gflops']:.2f}x): with two hosts the check cannot tell "
        "a slow host from one that overstates its figure, so neither is named alone"
    )
    median = (low["gflops"] + high["gflops"]) / 2
    return [_finding(SLOW_HOST, what, f"{low['host']}<->{high['host']}", low["gflops"], median, None)]


def allreduce_rows(results: Mapping[str, Mapping[str, Any]], tasks: int = 0) -> list[dict[str, Any]]:
    """Per size: the median task's mean time per all-reduce, algbw and busbw (GB/s, nccl-tests'). The
    ranks and the implementation are what most nodes say (one node's claim moves neither)."""
    by_size: dict[int, list[float]] = {}
    said = [int(r["workers"]) for r in results.values() if r.get("workers")]
    ranks = statistics.median_low(said) if said else (tasks or len(results))
    impls = Counter(str(r["communication"]) for r in results.values() if r.get("communication"))
    impl = impls.most_common(1)[0][0] if impls else None
    measured = [r for r in results.values() if r.get("allreduce")]
    for r in measured:
        for x in r["allreduce"]:
            by_size.setdefault(int(x["bytes"]), []).append(float(x["latency_s"]))
    rows = []
    for size, times in sorted(by_size.items()):
        if len(times) * 2 < len(measured):
            continue  # a size only a minority measured is not one the check asked for
        t = statistics.median(times)
        algbw = size / t / 1e9 if t > 0 else None
        rows.append(
            {
                "bytes": size,
                "latency_s": t,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * busbw_factor(ranks) if algbw is not None else None,
                "ranks": ranks,
                "communication": impl,
            }
        )
    return rows


def network(links: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The network a ring is held to: the slowest link's bandwidth, the largest one-way latency."""
    if not links:
        return {"latency_s": None, "bandwidth_Bps": None, "link": None}
    slowest = min(links, key=lambda x: x["bandwidth_Bps"])
    return {
        "latency_s": max(x["latency_s"] for x in links),
        "bandwidth_Bps": slowest["bandwidth_Bps"],
        "link": f"{slowest['a']}<->{slowest['b']}",
    }


def check_text(check: Mapping[str, Any]) -> str:
    """The tables and the verdict, for a terminal."""
    out = ["hosts (matmul rate, relative to the median host)"]
    out.append(f"  {'TASK':<10} {'HOST':<22} {'DEVICE':<6} {'GFLOP/s':>9} {'SCORE':>6} {'BEST LINK':>11}")
    for r in check["hosts"]:
        g = f"{r['gflops']:.1f}" if r["gflops"] is not None else "-"
        s = f"{r['score']:.2f}" if r["score"] is not None else "-"
        b = _gbps(r["best_link_Bps"]) if r.get("best_link_Bps") else "-"
        out.append(f"  {r['task']:<10} {r['host']:<22} {r['device'] or '-':<6} {g:>9} {s:>6} {b:>11}")
    if check["links"]:
        out.append("\nlinks (TCP on the TF port; round 1: pairs, then the slowest with the fastest)")
        out.append(f"  {'A':<22} {'B':<22} {'ROUND':>5} {'LATENCY':>10} {'BANDWIDTH':>11}")
        for x in check["links"]:
            out.append(
                f"  {x['a']:<22} {x['b']:<22} {x['round'] or '-':>5} {x['latency_s'] * 1e6:>8.0f}us {_gbps(x['bandwidth_Bps']):>11}"
            )
    if check["allreduce"]:
        first = check["allreduce"][0]
        out.append(f"\nall-reduce ({first['communication'] or '?'}, {first['ranks']} ranks; busbw = algbw * 2(n-1)/n)")
        out.append(f"  {'BYTES':>10} {'TIME':>10} {'ALGBW':>10} {'BUSBW':>10}")
        for a in check["allreduce"]:
            alg = f"{a['algbw_GBps']:.3f}" if a["algbw_GBps"] is not None else "-"
            bus = f"{a['busbw_GBps']:.3f}" if a["busbw_GBps"] is not None else "-"
            out.append(f"  {a['bytes']:>10} {a['latency_s'] * 1e3:>8.2f}ms {alg:>7}GB/s {bus:>7}GB/s")
    out.append("")
    if check["findings"]:
        out += [f"named: {f['what']}" for f in check["findings"]]
        out += [
            f"not named: {w['host']} ({w['task']}) waited for it (it reached {w['phase'] or 'nothing'!r})"
            for w in check.get("waited") or []
        ]
    else:
        out.append("nothing named: every host and link is within the tolerance of the median")
    return "\n".join(out)
