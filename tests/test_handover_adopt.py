"""A task restarted in place adopts its earlier incarnations' task directories (worker_entry.agent.handover):
only siblings of its own directory, of the same task and attempt; anything else stays where it is."""

from __future__ import annotations

from worker_entry.agent.handover import adopt_earlier


def test_earlier_incarnations_move_into_earlier_and_nothing_else_does(tmp_path):
    task = tmp_path / "worker-1"
    for name in ("attempt-0", "attempt-0-restart-1", "attempt-0-restart-2", "attempt-1"):
        (task / name).mkdir(parents=True)
        (task / name / "output.log").write_text(name)
    other = tmp_path / "ps-0" / "attempt-0"
    other.mkdir(parents=True)
    own = task / "attempt-0-restart-2"
    adopt_earlier(
        str(own),
        [
            str(task / "attempt-0"),
            str(task / "attempt-0-restart-1"),
            str(task / "attempt-1"),
            str(other),
            str(own),
            str(task / "attempt-0-restart-9"),
            "/etc",
        ],
    )
    assert sorted(p.name for p in (own / "earlier").iterdir()) == ["attempt-0", "attempt-0-restart-1"]
    assert (own / "earlier" / "attempt-0" / "output.log").read_text() == "attempt-0"
    assert (task / "attempt-1").is_dir() and other.is_dir() and not (task / "attempt-0").exists()
