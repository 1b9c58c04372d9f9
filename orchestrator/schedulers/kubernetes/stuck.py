"""Pods of an earlier attempt that will never finish terminating: their node does not answer.

A deleted pod stays ``Terminating`` until its node's kubelet confirms that the container is gone. On a
node that lost power or its network the kubelet never does: the pod stays until the node object is
deleted, tainted ``node.kubernetes.io/out-of-service``, or comes back. A JobSet (``restartStrategy:
Recreate``) recreates each child Job only once the old Job's pods are gone (it deletes them in the
foreground), and the launcher recreates an Indexed Job only once it is gone: without help, a restart
waits for the dead node. So a pod of an earlier attempt that is still terminating ``FORCE_MARGIN_S``
after its grace period — timed on the launcher's own clock from the first time it was seen deleting,
never from the API server's timestamps (clock skew) — is force-deleted (``gracePeriodSeconds: 0``),
and the launcher says so. The price, said in the warning: on a node that is only cut off, the old
container may still run until the node notices (its TF peers are gone, so it cannot train).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .pods import PodView

FORCE_MARGIN_S = 15.0  # beyond the pod's own grace: a kubelet that answers has finished by then
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


class StuckPods:
    """Which deleting pods are overdue; each is reported once."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.first_seen: dict[str, float] = {}
        self.forced: list[PodView] = []

    def overdue(self, views: Iterable[PodView]) -> list[PodView]:
        """Of ``views`` (pods of earlier attempts), those deleting for longer than their grace + margin."""
        now, out = self.clock(), []
        done = {v.name for v in self.forced}
        for v in views:
            if not v.deleting or v.name in done:
                continue
            since = self.first_seen.setdefault(v.name, now)
            grace = v.grace_s if v.grace_s is not None else DEFAULT_GRACE_S
            if now - since > grace + FORCE_MARGIN_S:
                out.append(v)
        self.forced.extend(out)
        return out

    def nodes(self) -> list[str]:
        """The nodes whose kubelet never confirmed a deletion (the ones a restart should avoid)."""
        return list(dict.fromkeys(v.node for v in self.forced if v.node))


def forced_message(v: PodView) -> str:
    grace = v.grace_s if v.grace_s is not None else DEFAULT_GRACE_S
    return (
        f"pod {v.name} (attempt {v.attempt}) on node {v.node or '?'} was still terminating {grace + FORCE_MARGIN_S:g}s "
        "after its deletion: that node's kubelet does not answer. Force-deleted (grace 0) so that the restart does "
        "not wait for the node; if the node is only cut off, its container may run on there until it notices"
    )
