"""Where the step clock's in-graph stamps go, and what is known about them at trace time.

- ``Ring``: one local replica's stamps in two local CPU variables (a counter and ``RING_ROWS`` rows of
  ``(seq, code, fn, call, a, b, c, inline..., examples)``), written by the graph, read by the reader
  thread. A row is valid when its ``seq`` column equals its position: a reader never takes a row that
  is half written or already overwritten by a newer lap. A replica function's row carries, in its last
  column, the examples its execution trained on across the replicas in sync (its own batch, measured
  in the graph when the batch dimension is not static, times the replicas per local replica): so a
  dataset batched without ``drop_remainder`` — partial last batches included — is counted exactly.
- the registry: every stamped traced function (``fn`` id, by its outermost ``FuncGraph``) and, per
  function, every stamped collective (``call`` index in trace order) with whether its inputs look like
  gradients and how many elements it reduces. The *primary* collectives of a function (its largest
  gradient all-reduces) are the step boundaries.
- the host intervals of eager ``next(distributed_iterator)`` calls (input fetched outside the
  ``tf.function``), bounded.

TensorFlow is imported only inside functions; nothing here raises into user code.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

RING_ROWS = 4096  # rows kept per replica until the reader takes them (older ones are overwritten)
INLINE = 2  # collectives of a replica function carried in its own row (more get rows of their own)
# seq, code, fn, call, a, b, c, INLINE x (call, t_enter, t_exit), examples, local_sq, total_sq
EXAMPLES = 7 + 3 * INLINE  # the column of a RUN row's examples (0: none known)
LOCAL_SQ, TOTAL_SQ = EXAMPLES + 1, EXAMPLES + 2  # the row's gradient all-reduces' squared norms (-1: none)
COLS = TOTAL_SQ + 1
# Row codes: COLLECTIVE: a collective outside any replica function (e.g. strategy.reduce of the loss),
# IN_RUN: one issued inside a replica function that did not fit its row (call, a=t_enter, b=t_exit);
# RUN: a replica function (a=t_start, b=t_data, c=t_done, inline: up to INLINE of its collectives as
# (call, t_enter, t_exit)), written when its work is done.
COLLECTIVE, RUN, IN_RUN = 2, 3, 4
MAX_INPUT_INTERVALS = 4096
MAX_FUNCTIONS = 4096


class Row(NamedTuple):
    """One stamp row as read back from a ring (times in seconds since the epoch)."""

    replica: int
    code: int
    fn: int
    call: int
    a: float
    b: float
    c: float = 0.0
    inline: tuple[tuple[int, float, float], ...] = ()
    examples: float = 0.0  # RUN rows: examples of this execution across the replicas in sync (0: unknown)
    # the gradient all-reduces the row describes: sum of |local|² and of |reduced/d|² (-1: none; may be
    # inf or nan: a step to skip)
    local_sq: float = -1.0
    total_sq: float = -1.0


class Ring:
    """One local replica's rows in two plain ``ResourceVariable``s on the host CPU, created eagerly
    (``init_scope``) and bypassing variable creator scopes: never distributed variables, never part of
    the model or its checkpoints."""

    def __init__(self, tf: Any, replica: int, rows: int = RING_ROWS) -> None:
        from tensorflow.python.ops import resource_variable_ops

        self.replica = replica
        self.size = rows
        self.read_upto = 0  # rows below this sequence number have been taken
        self.lost = 0  # rows overwritten before the reader took them
        with tf.init_scope(), tf.device("/cpu:0"):
            # the counter holds the index of the last row written (-1: none), so that assign_add's
            # result is the new row's index
            self.count = resource_variable_ops.ResourceVariable(
                tf.constant(-1, tf.int64), trainable=False, name=f"tfcluster_ring_count_{replica}"
            )
            self.rows = resource_variable_ops.ResourceVariable(
                tf.fill([rows, COLS], tf.constant(-1.0, tf.float64)),
                trainable=False,
                name=f"tfcluster_ring_{replica}",
            )

    def write(
        self, tf: Any, code: int, fn: int, call: int, values: list[Any], examples: Any = 0.0, norms: Any = None
    ) -> Any:
        """Graph side: append one row ``(index, code, fn, call, *values, ..., examples, local_sq,
        total_sq)`` (values padded with zeros; ``examples`` a number or a float64 scalar tensor;
        ``norms`` two float64 scalars or None): 8 small ops on the host CPU — the counter first, then the
        row carrying its own index."""
        with tf.name_scope("tfcluster_ring"), tf.device("/cpu:0"):
            index = tf.convert_to_tensor(self.count.assign_add(tf.constant(1, tf.int64), read_value=True))
            pad = [0.0] * (EXAMPLES - 4 - len(values))
            head = [tf.cast(index, tf.float64), float(code), float(fn), float(call)]
            row = tf.stack([*head, *values, *pad, examples, *(norms if norms is not None else (-1.0, -1.0))])
            where = tf.reshape(index % self.size, [1, 1])
            return self.rows.scatter_nd_update(where, tf.reshape(row, [1, COLS]))

    def take(self) -> list[Row]:
        """Reader side: the rows written since the last call, in write order."""
        count = int(self.count.numpy()) + 1
        if count <= self.read_upto:
            return []
        table = self.rows.numpy()
        start = max(self.read_upto, count - self.size)
        self.lost += start - self.read_upto
        out: list[Row] = []
        i = start
        while i < count:
            r = table[i % self.size].tolist()
            seq = int(r[0])
            if seq < i:  # counted but not written yet: take it next time
                break
            if seq == i:
                out.append(_row(self.replica, r))
            else:
                self.lost += 1  # a newer lap overwrote it meanwhile
            i += 1
        self.read_upto = i
        return out


def _row(replica: int, r: list[float]) -> Row:
    code, fn, call = int(r[1]), int(r[2]), int(r[3])
    if code == RUN:
        inline = tuple((int(r[7 + 3 * k]), r[8 + 3 * k], r[9 + 3 * k]) for k in range(min(call, INLINE)))
        return Row(replica, code, fn, call, r[4], r[5], r[6], inline, max(0.0, r[EXAMPLES]), r[LOCAL_SQ], r[TOTAL_SQ])
    return Row(replica, code, fn, call, r[4], r[5], r[6], local_sq=r[LOCAL_SQ], total_sq=r[TOTAL_SQ])


_lock = threading.Lock()
_rings: dict[int, Ring] = {}
_inputs: deque[tuple[float, float]] = deque(maxlen=MAX_INPUT_INTERVALS)


def ring(tf: Any, replica: int) -> Ring:
    with _lock:
        r = _rings.get(replica)
        if r is None:
            r = _rings[replica] = Ring(tf, replica)
        return r


def drain() -> list[Row]:
    """Every row written since the last call, per replica in write order (reads the variables eagerly)."""
    with _lock:
        rings = list(_rings.values())
    out: list[Row] = []
    for r in rings:
        out.extend(r.take())
    return out


def delivered() -> int:
    """Rows written by the graph in this process (tests, diagnostics)."""
    with _lock:
        rings = list(_rings.values())
    return sum(int(r.count.numpy()) + 1 for r in rings)


def lost() -> int:
    with _lock:
        return sum(r.lost for r in _rings.values())


def note_input(t0: float, t1: float) -> None:
    """An eager ``next()`` on a distributed iterator took [t0, t1] (``time.time()`` seconds)."""
    _inputs.append((t0, t1))


def take_inputs() -> list[tuple[float, float]]:
    out = []
    while True:
        try:
            out.append(_inputs.popleft())
        except IndexError:
            return out


# ---------------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Wire:
    """What one all-reduce call sends (from its traced tensors): dense bytes, tensors, IndexedSlices
    (all-gathered instead), packs, ``bytes_per_pack`` and the implementation asked for."""

    nbytes: int = 0
    tensors: int = 0
    sparse: int = 0
    packs: int = 0
    bytes_per_pack: int = 0
    implementation: str = "auto"


@dataclass
class CallInfo:
    gradient: bool
    elements: int
    wire: Wire = field(default_factory=Wire)
    group: int = 1  # the replicas the all-reduce sums (every worker's)
    optimizer: str | None = None  # the optimizer whose update reduced these gradients, when found


@dataclass
class FnInfo:
    fn: int
    calls: dict[int, CallInfo] = field(default_factory=dict)
    next_call: dict[int, int] = field(default_factory=dict)  # per replica: the next call index
    runs: bool = False  # its replica functions are stamped (a RUN row follows their collectives)
    solo: list[Wire] = field(default_factory=list)  # gradient reductions TF skipped (one replica in all)
    loss_call: int | None = None  # the scalar the step function returns through strategy.reduce


_fns: dict[int, FnInfo] = {}
_graphs: dict[int, tuple[Any, int]] = {}  # id(outermost graph) -> (weakref to it, fn id)


def fn_id(graph: Any) -> int:
    """The id of the stamped function whose outermost graph is ``graph`` (assigned on first use)."""
    with _lock:
        entry = _graphs.get(id(graph))
        if entry is not None and entry[0]() is graph:
            return entry[1]
        fid = len(_fns) + 1
        if fid > MAX_FUNCTIONS:  # a retracing storm: reuse one id rather than grow without bound
            fid = MAX_FUNCTIONS
            for key in [k for k, (ref, _) in _graphs.items() if ref() is None]:
                del _graphs[key]  # graphs gone since
        _fns.setdefault(fid, FnInfo(fid))
        try:
            ref = weakref.ref(graph)
        except TypeError:
            ref = lambda g=graph: g  # noqa: E731 - objects without weakref support (tests)
        _graphs[id(graph)] = (ref, fid)
        return fid


def next_call(fid: int, replica: int) -> int:
    """Number one collective of ``replica`` in function ``fid`` (every replica numbers alike)."""
    with _lock:
        info = _fns.setdefault(fid, FnInfo(fid))
        n = info.next_call.get(replica, 0)
        info.next_call[replica] = n + 1
        return n


def note_call(
    fid: int,
    call: int,
    gradient: bool,
    elements: int,
    wire: Wire | None = None,
    group: int = 1,
    optimizer: str | None = None,
) -> None:
    with _lock:
        info = CallInfo(gradient, elements, wire or Wire(), group, optimizer)
        _fns.setdefault(fid, FnInfo(fid)).calls.setdefault(call, info)


def claim_loss_call(fid: int, call: int) -> bool:
    """``call`` (a scalar reduced outside the replica function) is the loss the step function returns,
    if it is the first such in a function that all-reduced gradients before it (traced in order)."""
    with _lock:
        info = _fns.get(fid)
        if info is None or info.loss_call is not None or not any(i.gradient for i in info.calls.values()):
            return False
        info.loss_call = call
        return True


def loss_call(fid: int) -> int | None:
    with _lock:
        info = _fns.get(fid)
        return info.loss_call if info else None


def step_noise(fid: int) -> tuple[int, str | None]:
    """(replicas summed, optimizer) of ``fid``'s gradient all-reduces: N of the noise scale's estimator."""
    with _lock:
        info = _fns.get(fid)
        grads = [i for i in info.calls.values() if i.gradient] if info else []
    group = max((i.group for i in grads), default=1)
    return group, next((i.optimizer for i in grads if i.optimizer), None)


def note_solo(fid: int, wire: Wire) -> None:
    """One replica in all (one worker, one device): TF returns the gradients of a ``batch_reduce``
    as they are, without a collective. Each replica-function run of ``fid`` is then one step (its RUN
    row closes it), and ``wire`` is what the same reduction would send with more workers."""
    with _lock:
        info = _fns.setdefault(fid, FnInfo(fid))
        if len(info.solo) < 64:
            info.solo.append(wire)


def is_solo(fid: int) -> bool:
    with _lock:
        info = _fns.get(fid)
        return bool(info and info.solo)


def step_wire(fid: int) -> dict[str, Any] | None:
    """What one step of ``fid`` all-reduces: its gradient all-reduces' wire figures over its step
    boundaries (several primaries when a loop unrolled steps: their share each), or the reductions TF
    skipped with one replica; None without any."""
    with _lock:
        info = _fns.get(fid)
        wires = [i.wire for i in info.calls.values() if i.gradient] if info else []
        solo = list(info.solo) if info else []
    steps = len(primary_calls(fid)) if wires else 1
    if not wires:
        wires = solo
    if not wires or not steps:
        return None
    impls = sorted({w.implementation for w in wires})
    return {
        "grad_bytes": sum(w.nbytes for w in wires) // steps,
        "grad_tensors": sum(w.tensors for w in wires) // steps,
        "grad_sparse": sum(w.sparse for w in wires) // steps,
        "grad_packs": sum(w.packs for w in wires) // steps,
        "bytes_per_pack": max(w.bytes_per_pack for w in wires),
        "allreduce_impl": impls[0] if len(impls) == 1 else "mixed",
    }


def note_run(fid: int) -> None:
    """A replica function of ``fid`` is stamped (its rows carry its examples)."""
    with _lock:
        _fns.setdefault(fid, FnInfo(fid)).runs = True


def has_runs(fid: int) -> bool:
    with _lock:
        info = _fns.get(fid)
        return bool(info and info.runs)


def primary_calls(fid: int) -> frozenset[int]:
    """The step boundaries of a function: its gradient all-reduces of the largest size (several when
    a Python loop unrolled steps into one function); empty when it has no gradient all-reduce."""
    with _lock:
        info = _fns.get(fid)
        grads = {c: i.elements for c, i in info.calls.items() if i.gradient} if info else {}
    if not grads:
        return frozenset()
    top = max(grads.values())
    return frozenset(c for c, e in grads.items() if e == top)


def reset_for_tests() -> None:
    with _lock:
        _rings.clear()
        _fns.clear()
        _graphs.clear()
        _inputs.clear()
