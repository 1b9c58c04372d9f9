"""The evaluator's metrics on the launcher: through the real job, supervisor and sinks over fake nodes,
each evaluation is one ``evaluation`` event, the evaluator's status entry (how many, the last one),
its report rows per checkpoint, Prometheus gauges by task and metric and TensorBoard ``eval/<metric>``
scalars — and a bad evaluation (huge, non-finite) fails only the evaluator, reported, never the launcher."""

from __future__ import annotations

import json
import threading
import time

from fakenode import FakeBackend, FakeNode, healthy, make_plan, stopped
from test_roles_supervise import EVAL_HOSTS

from orchestrator.core.states import JobState
from orchestrator.events import read_events
from orchestrator.events.evaluations import Evaluations, evaluation_record
from orchestrator.events.kinds import Evaluation
from orchestrator.job import Job, LaunchOptions
from orchestrator.runs import RunDir
from orchestrator.sinks.metrics import JobMetrics, _Collector
from orchestrator.sinks.tensorboard import Scalars, TensorBoardSink
from orchestrator.views.control import job_status, status_text
from orchestrator.views.pages import report_page
from orchestrator.views.report import build_report, report_text
from worker_entry import protocol as p

EVALS = [
    p.Evaluation(count=1, metrics={"loss": 0.5, "mae": 0.25}, step=10, checkpoint="/ckpt/ckpt-1", source="sidecar"),
    p.Evaluation(
        count=2, metrics={"loss": 0.125, "mae": 0.0625}, step=20, checkpoint="/ckpt/ckpt-2", source="sidecar", dropped=1
    ),
]


def evaluator(bad: bytes | None = None, sent: threading.Event | None = None):
    def script(n: FakeNode) -> None:
        n.hello()
        n.wait_for(p.Go)
        n.send(p.Spawned(pid=9))
        for e in EVALS:
            n.send(e)
            time.sleep(0.15)
        if sent is not None:
            sent.set()
        if bad is not None:
            n.raw(p.HEADER.pack(p.T_MSG, 0, len(bad)) + bad)
        stopped(n, n.run_until_stopped())

    return script


def launch(tmp_path, scripts, **sections):
    loaded, plan = make_plan(
        3, hosts=EVAL_HOSTS, tensorflow={"strategy": "multi_worker_mirrored"}, metrics={"port": 0}, **sections
    )
    backend = FakeBackend(scripts)
    run = tmp_path / "run"
    job = Job(loaded, plan, LaunchOptions(run_dir=str(run), gather=False, live=False, echo_logs=False), backend)
    return job.run(), run


def test_evaluations_are_events_status_and_report_rows(tmp_path):
    scripts = {"worker:0": healthy(1.5), "worker:1": healthy(1.5), "evaluator:0": evaluator()}
    result, run = launch(tmp_path, scripts)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    events = [e for e in read_events(run / "events.jsonl") if isinstance(e, Evaluation)]
    assert [(e.task, e.count, e.step, e.checkpoint, e.metrics) for e in events] == [
        ("evaluator:0", m.count, m.step, m.checkpoint, m.metrics) for m in EVALS
    ]
    entry = json.loads((run / "status.json").read_text())["tasks"]["evaluator:0"]["evaluation"]
    assert entry["evaluations"] == 2 and entry["metrics"] == EVALS[1].metrics and entry["step"] == 20
    assert entry["checkpoint"] == "/ckpt/ckpt-2" and entry["dropped"] == 1
    text = status_text(job_status(RunDir(run)))
    assert "evaluator:0: 2 evaluation(s); last: checkpoint ckpt-2 (step 20): loss 0.125 mae 0.0625" in text
    rep = build_report(RunDir(run))
    rows = rep.to_dict()["evaluations"]["evaluator:0"]
    assert [(r["checkpoint"], r["step"], r["metrics"]) for r in rows] == [
        (m.checkpoint, m.step, m.metrics) for m in EVALS
    ]
    out = report_text(rep)
    assert "evaluations of evaluator:0 (2, as it reported them):" in out
    assert [line.split() for line in out.splitlines() if line.strip().startswith(("CHECKPOINT", "ckpt-"))] == [
        ["CHECKPOINT", "STEP", "loss", "mae"],
        ["ckpt-1", "10", "0.5", "0.25"],
        ["ckpt-2", "20", "0.125", "0.0625"],
    ]
    html, _ = report_page(RunDir(run), rep, out, tmp_path / "html")
    assert "Evaluations of evaluator:0 (2)" in html.read_text() and "0.0625" in html.read_text()


def test_status_counts_the_evaluations_of_every_attempt_as_report_lists_them(tmp_path):
    """A job restart starts a new evaluator process (its own count from 1): status still counts the
    run's evaluations, the same as report."""
    sent = threading.Event()

    def worker0(n: FakeNode) -> None:
        if n.config.attempt == 0:  # fails once the evaluator sent both evaluations: the job restarts
            n.hello()
            n.wait_for(p.Go)
            n.send(p.Spawned(pid=7))
            sent.wait(30)
            n.exited(1)
        else:
            healthy(1.5)(n)

    scripts = {"worker:0": worker0, "worker:1": healthy(1.5), "evaluator:0": evaluator(sent=sent)}
    result, run = launch(tmp_path, scripts, restart={"max_restarts": 1})
    assert result.state == JobState.SUCCEEDED and len(result.attempts) == 2, result.root_cause
    entry = json.loads((run / "status.json").read_text())["tasks"]["evaluator:0"]["evaluation"]
    rows = build_report(RunDir(run)).to_dict()["evaluations"]["evaluator:0"]
    assert entry["evaluations"] == len(rows) == 4 and entry["step"] == rows[-1]["step"] == 20
    assert "evaluator:0: 4 evaluation(s)" in status_text(job_status(RunDir(run)))


def test_a_bad_evaluation_fails_only_the_evaluator_and_is_reported(tmp_path):
    bad = b'{"type":"evaluation","count":3,"metrics":{"loss":1e999}}'
    scripts = {"worker:0": healthy(1.5), "worker:1": healthy(1.5), "evaluator:0": evaluator(bad)}
    result, run = launch(tmp_path, scripts)
    assert result.state == JobState.SUCCEEDED, result.root_cause
    events = read_events(run / "events.jsonl")
    (err,) = [e for e in events if e.event == "protocol_error"]
    assert err.task == "evaluator:0" and "evaluation.metrics.loss: expected a number" in err.message
    (rf,) = [e for e in events if e.event == "role_failure"]
    assert (rf.task, rf.action) == ("evaluator:0", "report")
    assert [e.count for e in events if isinstance(e, Evaluation)] == [1, 2]  # the good ones are kept


def test_the_metrics_export_the_last_evaluation_by_task_and_metric():
    folded = Evaluations()
    for m in EVALS:
        folded.add(
            Evaluation(
                task="evaluator:0",
                host="h",
                count=m.count,
                metrics=m.metrics,
                step=m.step,
                checkpoint=m.checkpoint,
                source=m.source,
            )
        )
    metrics = JobMetrics("j", "r")
    last = folded.last("evaluator:0")
    metrics.update(
        {
            "state": "running",
            "tasks": {
                "evaluator:0": {"host": "h", "state": "running", "evaluation": last},
                "worker:0": {"host": "g", "state": "running"},
            },
        }
    )
    families = {f.name: f for f in _Collector(metrics).collect()}
    samples = families["tfcluster_task_evaluation_metric"].samples
    assert {(s.labels["task"], s.labels["metric"], s.value) for s in samples} == {
        ("evaluator:0", "loss", 0.125),
        ("evaluator:0", "mae", 0.0625),
    }
    assert [s.value for s in families["tfcluster_task_evaluations"].samples] == [2]
    assert [s.value for s in families["tfcluster_task_evaluation_step"].samples] == [20]
    # a damaged entry (a hand-edited status, a newer launcher) never fails a scrape
    metrics.update({"tasks": {"evaluator:0": {"evaluation": {"metrics": {"loss": float("nan"), "x": 10**400}}}}})
    assert {f.name: f for f in _Collector(metrics).collect()}["tfcluster_task_evaluation_metric"].samples == []


def test_tensorboard_writes_every_evaluation_at_the_step_it_evaluated(tmp_path):
    """One point per event, however close together (two in the same second both count); a status
    snapshot carrying the last evaluation adds none."""
    scalars = Scalars()
    points = []
    for m in EVALS:
        e = Evaluation(
            task="evaluator:0",
            count=m.count,
            metrics=m.metrics,
            step=m.step,
            checkpoint=None,
            source="evaluate",
            ts=100.0,
        )
        points += scalars.evaluation(e)
        status = {"updated": 100.0, "tasks": {"evaluator:0": {"state": "running", "evaluation": evaluation_record(e)}}}
        points += [pt for pt in scalars.status(status) if pt.run == "evaluator-0"]
    assert [(pt.step, pt.values) for pt in points] == [
        (10, {"eval/loss": 0.5, "eval/mae": 0.25}),
        (20, {"eval/loss": 0.125, "eval/mae": 0.0625}),
    ]
    # through the live sink on the bus: both land in the evaluator's event file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb", ["worker:0", "evaluator:0"])
    sink.write("worker:0", {"kind": "heartbeat", "ts": 100.0, "progress": {"steps": 20}})
    for m in EVALS:
        sink.handle(
            Evaluation(
                task="evaluator:0", count=m.count, metrics=m.metrics, step=m.step, checkpoint=None, source="evaluate"
            )
        )
    sink.close()
    assert sink.problems == []
    acc = EventAccumulator(str(tmp_path / "tb" / "evaluator-0"))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("eval/loss")] == [(10, 0.5), (20, 0.125)]
