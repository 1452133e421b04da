"""Every node's GPUs in numpy columns, so that a request shape met for the first time is judged on all
nodes at once (issue 30, item 15).

decide_on remembers each node's verdict per request shape (NodeInfo.fit_cache); a shape it has not met
on a node costs place.count_fit and, where the node refuses, place.brief_reason: a Python loop over the
node's GPUs, on every node, which at thousands of nodes set the filter's p99 (docs/cluster.md, "Where the
time goes"). Here each node is a row of
WIDTH GPUs (slots, memory and cores, total and used, and the flags that refuse a GPU whatever it is
asked), written once per node usage; a new shape is one pass of array operations over every row, the
first failing check of each GPU (fit.refusal_kind's order) as a code, counted per row.

Only what is the same for every GPU of the pod's one GPU container is judged here: no type, mode or UUID
filters, no numa-bind, no MIG GPU on the node, at most WIDTH GPUs. Anything else goes through
place.count_fit and place.brief_reason as before; so does a node whose row is stale.

A row is current while the NodeInfo's verdict memo is the dict it was written with: usage.add_pod, and
any code that changes a node's usage, drops the memo (model.NodeInfo), and a rebuilt node is a new
object with a new memo.
"""

from __future__ import annotations

import threading

from pyvgpu.cluster.core import keys
from pyvgpu.cluster.core.model import ContainerRequest, NodeInfo, PodRequest

WIDTH = 8  # GPUs a row holds; a node with more goes through the Python path
MAX_ROWS = 65536  # rows kept; past it the table starts again (rows are rewritten as nodes are met)
# Refusal codes in fit.refusal_kind's order (0: the GPU takes the container; -1: no GPU in that column)
KINDS = (None, "inconsistent", "unhealthy", "cordoned", "slots", "mutex", "memory", "cores",
         "in use (asks the whole GPU)", "all cores in use")
# Columns per GPU
_COUNT, _USED, _TMEM, _UMEM, _TCORE, _UCORE, _STATIC = range(7)


def usable(req: PodRequest, single: ContainerRequest | None, filtered: bool) -> bool:
    """Whether a shape can be judged on columns (see the module's text)."""
    return single is not None and not filtered and not req.numa_bind


class Columns:
    """Rows of GPU usage by node name. Thread-safe: filters run on several threads."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}
        self._memo: list[dict | None] = []  # the NodeInfo's verdict memo each row was written from
        self._ndev: list[int] = []
        self._data = np.zeros((0, WIDTH, 7), dtype=np.int64)

    def __len__(self) -> int:
        return len(self._rows)

    def _write(self, n: NodeInfo) -> int | None:
        """The node's row (written now if missing or stale), or None when the node is not for columns."""
        np = self._np
        if n.error or len(n.devices) > WIDTH or any(d.mode == keys.MIG for d in n.devices):
            return None
        row = self._rows.get(n.name)
        if row is None:
            if len(self._rows) >= MAX_ROWS:
                self._rows.clear()
                self._memo.clear()
                self._ndev.clear()
                self._data = np.zeros((0, WIDTH, 7), dtype=np.int64)
            row = len(self._memo)
            if row >= len(self._data):
                grown = np.zeros((max(64, 2 * len(self._data)), WIDTH, 7), dtype=np.int64)
                grown[:len(self._data)] = self._data
                self._data = grown
            self._memo.append(None)
            self._ndev.append(0)
            self._rows[n.name] = row
        values = [[d.count, d.used, d.totalmem, d.usedmem, d.totalcore, d.usedcores,
                   1 if d.problem else 2 if not d.health else 3 if d.cordoned else 0] for d in n.devices]
        try:
            self._data[row] = -1
            if values:
                self._data[row, :len(values)] = values
        except OverflowError:  # a number no GPU has: the Python path says what is wrong with it
            self._memo[row] = None
            return None
        if n.fit_cache is None:
            n.fit_cache = {}
        self._memo[row] = n.fit_cache
        self._ndev[row] = len(n.devices)
        return row

    def prepare(self, nodes: list[NodeInfo]) -> None:
        """Write the rows of these nodes now (the cache does it before it reports ready, so that the first
        filter does not)."""
        with self._lock:
            for n in nodes:
                row = self._rows.get(n.name)
                if row is None or n.fit_cache is None or self._memo[row] is not n.fit_cache:
                    self._write(n)

    def judge(self, nodes: list[NodeInfo], ctr: ContainerRequest, mutex: bool):
        """For each node: its GPUs counted per code of KINDS, packed in one int (fitting() reads the first
        count: the GPUs that take one GPU of `ctr`), or None when the node goes through the Python path."""
        np = self._np
        with self._lock:
            at, memo = self._rows, self._memo
            rows = [at.get(n.name) for n in nodes]
            stale = [i for i, (n, r) in enumerate(zip(nodes, rows, strict=True))
                     if r is None or n.fit_cache is None or memo[r] is not n.fit_cache]
            for i in stale:
                rows[i] = self._write(nodes[i])
            live = rows if not stale else [r for r in rows if r is not None]
            if not live:
                return [None] * len(nodes)
            idx = np.fromiter(live, dtype=np.int64, count=len(live))
            g = self._data[idx]  # (rows, WIDTH, 7)
        count, used, tmem, umem = g[..., _COUNT], g[..., _USED], g[..., _TMEM], g[..., _UMEM]
        tcore, ucore, static = g[..., _TCORE], g[..., _UCORE], g[..., _STATIC]
        cores = ctr.coresreq
        mem = np.full(count.shape, ctr.memreq, dtype=np.int64) if ctr.memreq > 0 else tmem * ctr.mem_percentage // 100
        # the first failing check wins: fit.refusal_kind's order, written from the last check to the first
        code = np.zeros(count.shape, dtype=np.int64)
        if cores == 0:
            code[(tcore != 0) & (ucore >= tcore)] = 9
        if cores == 100:
            code[(tcore == 100) & (used > 0)] = 8
        code[tcore - ucore < cores] = 7
        code[tmem - umem < mem] = 6
        if mutex:
            code[used > 0] = 5
        code[used >= count] = 4
        code[static > 0] = static[static > 0]
        code[count < 0] = -1  # no GPU in this column (rows are padded with -1)
        # a row's counts as one number, four bits a kind (a count is at most WIDTH): one Python int per node
        packed = np.zeros(len(live), dtype=np.int64)
        for k in range(len(KINDS)):
            packed |= (code == k).sum(axis=1) << (4 * k)
        counts = packed.tolist()
        if len(live) == len(rows):
            return counts
        it = iter(counts)
        return [None if r is None else next(it) for r in rows]


def fitting(packed: int) -> int:
    """The GPUs that take the container, from a node's packed counts (Columns.judge)."""
    return packed & 15


_REASONS: dict[tuple, str] = {}


def brief_reason(packed: int, ctr: ContainerRequest) -> str:
    """place.brief_reason's words from a node's packed counts (Columns.judge; numa-bind is never judged here)."""
    key = (packed, ctr.name, ctr.nums)
    got = _REASONS.get(key)
    if got is not None:
        return got
    counts = [(packed >> (4 * k)) & 15 for k in range(len(KINDS))]
    out = f'{counts[0]} of {sum(counts)} GPU(s) can take container "{ctr.name}", {ctr.nums} needed'
    kinds = {KINDS[k]: v for k, v in enumerate(counts) if k and v}
    if kinds:
        out += "; refused for " + ", ".join(f"{k} ({v})" for k, v in sorted(kinds.items()))
    if len(_REASONS) >= 65536:
        _REASONS.clear()
    _REASONS[key] = out
    return out
