"""Stage 8: transfers. Gather logs and the chief's checkpoints back, verified and resumable; copy the
chief's backup to the other tasks before a restart. Whatever a node names is hostile input."""

from .backup import seed_backups, sync_backup
from .gather import gather_after_run
from .paths import UnsafePath, dest_path, safe_relpath

__all__ = ["UnsafePath", "dest_path", "gather_after_run", "safe_relpath", "seed_backups", "sync_backup"]
