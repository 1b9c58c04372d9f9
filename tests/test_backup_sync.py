"""Backup sync before a restart never opens a launcher-local path named by a node (issue 10.1)."""

from __future__ import annotations

import json

from fakenode import make_plan
from localconn import LocalConnection

from orchestrator.events import EventBus
from orchestrator.transfer import sync_backup


class Events:
    def __init__(self) -> None:
        self.items: list = []

    def handle(self, ev) -> None:
        self.items.append(ev)

    def close(self) -> None:
        pass


def test_a_chief_listing_launcher_files_gets_only_its_own_backup_copied(tmp_path):
    secret = tmp_path / "launcher" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY----- TOP SECRET")
    _, plan = make_plan(2, restart={"max_restarts": 1, "backup_dir": "~/backup"})
    chief_home, worker_home = tmp_path / "chief", tmp_path / "worker"
    (chief_home / "backup" / "chief").mkdir(parents=True)
    (chief_home / "backup" / "chief" / "ckpt-1.index").write_bytes(b"real backup")
    worker_home.mkdir()

    def hostile(argv):
        """The chief answers the listing with paths outside its backup: the launcher's private key."""
        if argv[-1] != "manifest":
            return None
        root = str(chief_home / "backup" / "chief")
        files = [
            {"path": "ckpt-1.index", "size": 11},
            {"path": str(secret), "size": secret.stat().st_size},
            {"path": "../" * 12 + str(secret).lstrip("/"), "size": secret.stat().st_size},
        ]
        return (json.dumps({"manifests": [{"root": root, "exists": True, "files": files}]}) + "\n").encode()

    conns = {"worker:0": LocalConnection(chief_home, hostile), "worker:1": LocalConnection(worker_home)}
    events = Events()
    done = sync_backup(plan, conns, EventBus([events]))
    assert done["synced"] == ["worker:1"] and done["files"] == 1
    copied = {p.relative_to(worker_home): p.read_bytes() for p in worker_home.rglob("*") if p.is_file()}
    assert copied == {__import__("pathlib").Path("backup/chief/ckpt-1.index"): b"real backup"}
    assert not any(b"TOP SECRET" in data for data in copied.values())
