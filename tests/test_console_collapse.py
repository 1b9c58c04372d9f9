"""The console collapses what every rank says and hides TensorFlow's known chatter (``sinks.collapse``,
``sinks.noise``); the logs keep every line. A fake clock decides the window: no test sleeps."""

from __future__ import annotations

import io
from pathlib import Path

from orchestrator.runs import RunDir
from orchestrator.sinks.collapse import MAX_HELD, NOISE_NOTE, WINDOW_S, ConsoleLines, task_ranges
from orchestrator.sinks.logs import LogRouter
from orchestrator.sinks.noise import PATTERNS, is_noise

BANNER = b"I0000 00:00:1795777703.404786   31791 cpu_feature_guard.cc:227] This TensorFlow binary is optimized"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _lines(clock: Clock, **kw) -> tuple[ConsoleLines, list[bytes]]:
    shown: list[bytes] = []
    return ConsoleLines(shown.append, clock=clock, **kw), shown


def _tag(task: str) -> bytes:
    return f"[{task} h] ".encode()


def test_the_same_line_from_every_task_within_the_window_is_one_line_with_the_tasks_as_ranges():
    clock = Clock()
    console, shown = _lines(clock)
    for i in [*range(64)]:
        console.add(f"worker:{i}", _tag(f"worker:{i}"), [b"hello from every rank"])
        clock.t += 0.01  # 64 lines over 0.64 s: within the window
    console.flush()
    assert shown == []  # held: the first arrived 0.64 s ago
    clock.t = 1000.0 + WINDOW_S
    console.flush()
    assert shown == [b"[worker:0-63] hello from every rank\n"]


def test_a_line_no_other_task_said_keeps_its_own_prefix_and_waits_no_longer_than_the_window():
    clock = Clock()
    console, shown = _lines(clock)
    console.add("worker:1", _tag("worker:1"), [b"only mine"])
    clock.t += WINDOW_S - 0.01
    console.flush()
    assert shown == []
    clock.t += 0.01
    console.flush()
    assert shown == [b"[worker:1 h] only mine\n"]


def test_a_line_past_the_window_starts_a_new_one():
    clock = Clock()
    console, shown = _lines(clock)
    console.add("worker:0", _tag("worker:0"), [b"same"])
    clock.t += WINDOW_S
    console.flush()
    console.add("worker:1", _tag("worker:1"), [b"same"])
    console.close()
    assert shown == [b"[worker:0 h] same\n", b"[worker:1 h] same\n"]


def test_glog_headers_differing_in_time_and_thread_are_the_same_line_and_the_first_text_is_shown():
    clock = Clock()
    console, shown = _lines(clock, show_noise=True)
    a = b"W0000 00:00:1795777714.557627   31790 dataset.cc:997] Input of GeneratorDatasetOp"
    b = b"W0000 00:00:1795777714.565916   31791 dataset.cc:997] Input of GeneratorDatasetOp"
    console.add("worker:0", _tag("worker:0"), [a])
    console.add("worker:2", _tag("worker:2"), [b])
    console.close()
    assert shown == [b"[worker:0,2] " + a + b"\n"]


def test_each_tasks_lines_keep_their_order_however_they_collapse():
    clock = Clock()
    console, shown = _lines(clock)
    console.add("worker:0", _tag("worker:0"), [b"A", b"B"])
    console.add("worker:1", _tag("worker:1"), [b"B", b"A"])  # joining A would show its A before its B
    console.add("worker:2", _tag("worker:2"), [b"A", b"B"])
    console.close()
    assert shown == [b"[worker:0,2] A\n", b"[worker:0-2] B\n", b"[worker:1 h] A\n"]
    # worker:1 said B, then A: on the console its B (in the second line) comes before its A (the third)


def test_a_task_repeating_its_own_line_is_shown_twice():
    clock = Clock()
    console, shown = _lines(clock)
    console.add("worker:0", _tag("worker:0"), [b"tick", b"tick"])
    console.add("worker:1", _tag("worker:1"), [b"tick", b"tick"])
    console.close()
    assert shown == [b"[worker:0-1] tick\n", b"[worker:0-1] tick\n"]


def test_close_shows_everything_held_and_a_flood_past_the_bound_flows():
    clock = Clock()
    console, shown = _lines(clock)
    for n in range(MAX_HELD + 10):
        console.add("worker:0", _tag("worker:0"), [f"line {n}".encode()])
    assert len(shown) == 10 and shown[0] == b"[worker:0 h] line 0\n"  # the oldest, at once
    console.close()
    assert len(shown) == MAX_HELD + 10 and shown[-1] == f"[worker:0 h] line {MAX_HELD + 9}\n".encode()


def test_known_chatter_is_hidden_once_announced_and_shown_with_all_output():
    clock = Clock()
    console, shown = _lines(clock)
    console.add("worker:0", _tag("worker:0"), [BANNER, b"mine"])
    console.add("worker:1", _tag("worker:1"), [BANNER])
    console.close()
    assert shown == [NOISE_NOTE, b"[worker:0 h] mine\n"] and console.hidden == 2
    everything, out = _lines(clock, show_noise=True, collapse=False)
    everything.add("worker:0", _tag("worker:0"), [BANNER])
    everything.add("worker:1", _tag("worker:1"), [BANNER])
    assert out == [_tag("worker:0") + BANNER + b"\n", _tag("worker:1") + BANNER + b"\n"]  # at once, each


def test_the_noise_patterns_match_the_lines_tf_prints_and_not_a_jobs_own_problem():
    noise = [
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        BANNER,
        b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        b"appropriate compiler flags.",
        b"I0000 00:00:1.2 7 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical "
        b"results due to floating-point round-off errors from different computation orders.",
        b"I0000 00:00:1795771190.468943    2587 kernel_and_device.cc:101] Ignoring error status when releasing "
        b"multi-device function handle UNIMPLEMENTED: Releasing a multi-device component handle on a remote device",
        b"E0000 00:00:1.5 9 cuda_dnn.cc:8579] Unable to register cuDNN factory: Attempting to register factory",
    ]
    for line in noise:
        assert is_noise(line), line
    for line in (
        b"E0000 00:00:1.5 9 collective_ops.cc:1] Collective ops is aborted by: Socket closed",
        b"RuntimeError: Collective ops must be configured at program startup",
        b"Epoch 1/2",
        b"W0000 00:00:1.5 9 kernel_and_device.cc:101] Something else UNIMPLEMENTED",
    ):
        assert not is_noise(line), line
    assert all(why and pattern for why, pattern in PATTERNS)


def test_task_ranges_by_role_the_chief_first():
    tasks = ["worker:5", "worker:0", "chief:0", "worker:1", "worker:2", "ps:1", "ps:0", "evaluator"]
    assert task_ranges(tasks) == "chief:0 ps:0-1 worker:0-2,5 evaluator"


def test_the_router_logs_every_line_while_the_console_collapses_them(tmp_path: Path):
    clock = Clock()
    out = io.BytesIO()
    router = LogRouter(RunDir.create(tmp_path / "run"), out=out, color=False, clock=clock)
    router.open_attempt(0, [(f"worker:{i}", f"worker-{i}", f"10.0.0.{i}") for i in range(3)])
    for i in range(3):
        router.write(f"worker:{i}", BANNER + b"\nsame words\n")
    router.flush()
    assert out.getvalue() == NOISE_NOTE  # the rest held for the window
    clock.t += WINDOW_S
    router.flush()
    assert out.getvalue() == NOISE_NOTE + b"[worker:0-2] same words\n"
    router.write("worker:1", b"last words\n")
    router.close()  # the end shows what is held
    assert out.getvalue().endswith(b"[worker:1 10.0.0.1] last words\n")
    combined = (tmp_path / "run" / "combined.log").read_bytes()
    assert combined.count(b"same words") == 3 and combined.count(b"cpu_feature_guard") == 3
    for i in range(3):
        assert (tmp_path / "run" / "logs" / f"worker-{i}.log").read_bytes().startswith(BANNER + b"\nsame words\n")


def test_the_router_with_all_output_prints_every_line_at_once(tmp_path: Path):
    out = io.BytesIO()
    router = LogRouter(RunDir.create(tmp_path / "run"), out=out, color=False, all_output=True, clock=Clock())
    router.open_attempt(0, [(f"worker:{i}", f"worker-{i}", "h") for i in range(2)])
    for i in range(2):
        router.write(f"worker:{i}", BANNER + b"\n")
    assert out.getvalue() == b"".join(f"[worker:{i} h] ".encode() + BANNER + b"\n" for i in range(2))
    router.close()


def test_tfcluster_logs_hides_tf_noise_only_when_asked():
    from orchestrator.runs import logline
    from orchestrator.views.logs import LogQuery

    line = (logline.stamp(1.0) + b"[worker:0 h] " + BANNER).decode()
    assert LogQuery.from_args(tasks=None, grep=None, since=None, raw=False).render(line, False) is not None
    hidden = LogQuery.from_args(tasks=None, grep=None, since=None, raw=False, hide_tf_noise=True)
    assert hidden.render(line, False) is None
    assert hidden.render((logline.stamp(1.0) + b"[worker:0 h] loss 0.5").decode(), False) == "[worker:0 h] loss 0.5"
