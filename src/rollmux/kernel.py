"""The execution rule's kernel: a synchronous group's steady state from its memo key.

A key is what ``rollmux.intra.analyze`` builds from the members in admission order: per
member (t_roll, t_train, rollout node indices, training node indices, switch_roll,
switch_train), nodes numbered by first use. ``_simulate`` runs a specialised copy of
``GroupExecutor``'s rule on it in integer microsecond ticks from one start until the
state repeats (``rollmux.intra`` states the contract); ``shape_of`` and
``worst_iterations`` are what ``analyze`` and ``worst_start`` ask of it, through one
bounded memo of shapes (and one of each key's set-up and each pinning pattern's masks).

Pure Python over ints, tuples and lists, with no classes of its own beyond tuples, so
that mypyc can compile it unchanged: ``rollmux.native`` builds the compiled copy and
loads it in place of this file while the two match (``make install`` builds it; without
a C compiler or after an edit of this file, the package runs this source). The loop of
``_simulate`` also exists in C (``_csim.c``, built by the same command): where it is
built and fresh, and the group fits machine words (``_csim.prepare`` says), ``_simulate``
runs it on the key's set-up prepared in C and finishes in Python from what it returns;
otherwise, or with ``ROLLMUX_PURE_PYTHON`` set, its own loop runs. Both give the same
shapes. Likewise ``worst_iterations``' search over every order of a part (``_csim.scan``:
the orders, starts and settled starts in C, each run through ``_simulated`` here) where
the part has at most ``_SCAN_MAX`` members; both searches give the same maxima.
"""
from __future__ import annotations

import heapq
from bisect import insort
from itertools import permutations
from operator import itemgetter
from typing import Any, Callable, NamedTuple, Sequence

from rollmux.model import POOLS, ROLLOUT, TRAIN
from rollmux.native import simulator

MAX_ITERATIONS = 60
TICKS_PER_S = 1_000_000
_MEMO_LIMIT = 200_000
#: the C simulation loop (``rollmux._csim``), or None: see the module contract
_csim = simulator()


class _Shape(NamedTuple):
    """Analysis in positional form (member index, node index), shared by equal shapes."""

    period: float
    iteration_s: tuple[float, ...]
    utilization: tuple[float, float]
    #: one period, in ticks (nodes: str(index)); empty in a shape from a start other than
    #: every member ready for rollout (``_windowed``)
    window: list[tuple[int, str, tuple[str, ...], int, int, int]]
    t0: int


_memo: dict[tuple, _Shape] = {}


def key_of(members: Sequence[Any], pipelined: bool) -> tuple[tuple, tuple[str, ...]]:
    """The memo key of ``members`` (``rollmux.intra.MemberProfile``s, admission order) and
    the node names by number: per member (t_roll, t_train, rollout node numbers, training
    node numbers, switch_roll, switch_train), with its staleness appended when
    ``pipelined``; nodes numbered by first use."""
    index: dict[str, int] = {}
    key: list[tuple] = []
    for m in members:
        roll: list[int] = []
        for x in m.rollout_nodes:
            roll.append(index.setdefault(x, len(index)))
        train: list[int] = []
        for x in m.train_nodes:
            train.append(index.setdefault(x, len(index)))
        if pipelined:
            key.append((m.t_roll, m.t_train, tuple(roll), tuple(train), m.switch_roll, m.switch_train, m.staleness))
        else:
            key.append((m.t_roll, m.t_train, tuple(roll), tuple(train), m.switch_roll, m.switch_train))
    return tuple(key), tuple(index)


def shape_of(key: tuple, run: Callable[[tuple], _Shape] | None = None) -> _Shape:
    """The memoized shape of ``key`` from every member ready for rollout: ``run(key)``
    when given (a key with asynchronous members: ``rollmux.intra_async``), else the
    synchronous kernel, part by part when the group falls into parts (``_joined``)."""
    shape = _memo.get(key)
    if shape is None:
        if run is not None:
            shape = run(key)
        else:
            parts = _parts(key)
            shape = _simulate(key) if len(parts) == 1 else _joined(key, parts)
        _remember(key, shape)
    return shape


def worst_iterations(key: tuple, orders: bool, cap: list[float] | None) -> list[float]:
    """``rollmux.intra.worst_start`` on a synchronous key: each member's slowest steady
    iteration over the starts (2^n per order of each part, every order with ``orders``;
    orders that give a part the same key once), stopping at the first start that puts
    a member above ``cap`` (seconds, by member index) when given.

    Over every order, a start is skipped when an earlier run settled it: a run from the
    same start (which members are ready for training) whose order agreed with this one
    on every pair that may meet at instant 0 (two members in one queue with a node in
    common), and that consulted the order on no other pair (``_simulate``'s ``pairs``).
    That run made the choices this one would make at every step, so its iteration times
    are this one's. Not where two members of the part tie for the longest solo
    iteration: the order then picks the anchor, whose starts time the search."""
    worst = [0.0] * len(key)
    for part in _parts(key):
        if _csim is not None and orders and 1 < len(part) <= _SCAN_MAX and _scannable(key, part):
            if _scan(key, part, cap, worst):
                return worst
            continue
        seen: set[tuple] = set()
        meets = _meets(key, part) if orders and len(part) > 1 else None
        settled: set[tuple] = set()
        for order in (permutations(part) if orders and len(part) > 1 else (part,)):
            sub, _ = _part_key(key, list(order))
            if sub in seen:
                continue
            seen.add(sub)
            rank = {i: local for local, i in enumerate(order)}
            joins: dict[tuple, tuple] = {}  # snapshot state -> the steady state it leads to, and when
            for mask in range(1 << len(order) if len(order) > 1 else 1):
                pairs: set | None = None
                settles: tuple = ()
                common: frozenset = frozenset()
                if meets is not None:
                    at = 0  # the start by member index
                    for local, i in enumerate(order):
                        if mask >> local & 1:
                            at |= 1 << i
                    listed, common = meets(at)
                    settles = (at, tuple([rank[a] < rank[b] for a, b in listed]))
                    if settles in settled:
                        continue
                    pairs = set()
                shape = _simulated(sub, mask, joins, pairs)
                if pairs is not None and all(a >= 0 and (min(order[a], order[b]), max(order[a], order[b])) in common
                                             for a, b in pairs):
                    settled.add(settles)
                for local, i in enumerate(order):
                    worst[i] = max(worst[i], shape.iteration_s[local])
                if cap is not None and any(worst[i] > cap[i] for i in order):
                    return worst
    return worst


#: members of a part that ``_csim.scan`` takes
_SCAN_MAX = 10


def _scannable(key: tuple, part: list[int]) -> bool:
    """Whether ``_csim.scan`` takes ``part``: node indices 0..63 (always so in a key that
    ``rollmux.intra.sync_key`` numbered, up to 64 nodes)."""
    return all(0 <= x < 64 for i in part for x in key[i][2] + key[i][3])


def _scan(key: tuple, part: list[int], cap: list[float] | None, worst: list[float]) -> bool:
    """``worst_iterations``' search over every order of ``part`` with its loop in C
    (``_csim.scan``): the same orders, starts and runs; here each run (``_simulated`` on
    the order's sub-key, one ``joins`` map per order). Updates ``worst``; True when a
    member went above its cap."""
    classes: dict[tuple, int] = {}
    ids = tuple([classes.setdefault((key[i][0], key[i][1], *key[i][4:]), len(classes)) for i in part])
    cell: list = [None, (), {}]  # the order of the runs, its sub-key, its joins

    def run(order: tuple, mask: int, collect: bool) -> tuple[tuple[float, ...], set | None]:
        if order is not cell[0]:
            cell[0], cell[1], cell[2] = order, _part_key(key, list(order))[0], {}
        pairs: set | None = set() if collect else None
        return _simulated(cell[1], mask, cell[2], pairs).iteration_s, pairs

    local = [worst[i] for i in part]
    capped = _csim.scan(tuple(part), ids, tuple([key[i][2] for i in part]), tuple([key[i][3] for i in part]),
                        _tie(key, part), None if cap is None else tuple([cap[i] for i in part]), local, run)
    for x, i in enumerate(part):
        worst[i] = local[x]
    return bool(capped)


def _tie(key: tuple, part: list[int]) -> bool:
    """Whether two members of ``part`` tie for the longest solo iteration in ticks (the
    anchor then depends on the order)."""
    solo = [round(key[i][0] * TICKS_PER_S) + round(key[i][1] * TICKS_PER_S) for i in part]
    return solo.count(max(solo)) > 1


def _meets(key: tuple, part: list[int]) -> Callable[[int], tuple[list[tuple[int, int]], frozenset]] | None:
    """For ``worst_iterations``: a cached function of a start (bit i set: member i ready
    for training) giving the pairs (a, b), a < b, of ``part`` that may meet at instant 0
    (in one queue, with a node in common in that pool), listed and as a set; None when
    two members tie for the longest solo iteration in ticks (the anchor would depend on
    the order)."""
    if _tie(key, part):
        return None
    cache: dict[int, tuple[list[tuple[int, int]], frozenset]] = {}

    def meets(at: int) -> tuple[list[tuple[int, int]], frozenset]:
        found = cache.get(at)
        if found is None:
            listed = []
            for x, a in enumerate(part):
                for b in part[x + 1:]:
                    pool = at >> a & 1
                    if pool == at >> b & 1 and set(key[a][2 + pool]) & set(key[b][2 + pool]):
                        listed.append((min(a, b), max(a, b)))
            found = cache[at] = (listed, frozenset(listed))
        return found
    return meets


def memo_snapshot() -> tuple[dict, dict]:
    """A copy of the analysis memo and of the kernel set-ups (``memo_restore`` puts it
    back): benchmarks time one decision several times from the same memo."""
    return dict(_memo), dict(_setups)


def memo_restore(snapshot: tuple[dict, dict]) -> None:
    _memo.clear()
    _memo.update(snapshot[0])
    _setups.clear()
    _setups.update(snapshot[1])


def _remember(memo_key: tuple, shape: _Shape) -> None:
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[memo_key] = shape


def _simulated(key: tuple, train_first: int = 0, joins: dict | None = None, pairs: set | None = None) -> _Shape:
    """``_simulate`` of a connected group's key, memoized (all ready for rollout under the
    key itself, as ``analyze`` stores it; another start under (key, start)). ``joins`` and
    ``pairs`` as ``_simulate``'s, shared by the starts of one key; a shape from the memo
    adds (-1, -1) to ``pairs``: which pairs its run consulted is unknown."""
    memo_key = (key, train_first) if train_first else key
    shape = _memo.get(memo_key)
    if shape is None:
        shape = _simulate(key, train_first, joins, pairs)
        _remember(memo_key, shape)
    elif pairs is not None:
        pairs.add((-1, -1))
    return shape


def _part_key(key: tuple, part: list[int]) -> tuple[tuple, dict[int, int]]:
    """The key of the members ``part`` of group ``key`` alone, its nodes renamed by first
    use (so that equal parts share the memo), and the renaming (old index -> new)."""
    rename: dict[int, int] = {}
    sub = tuple((*key[i][:2], tuple(rename.setdefault(x, len(rename)) for x in key[i][2]),
                 tuple(rename.setdefault(x, len(rename)) for x in key[i][3]), *key[i][4:]) for i in part)
    return sub, rename


def _parts(key: tuple) -> list[list[int]]:
    """The connected parts of a key's sharing graph (members joined by a common node; the
    key's node indices are small ints), as member indices in admission order, parts
    ordered by their first member. Each part
    is kept with the bits of its nodes; a member merges every part whose nodes meet its
    own (parts never share a node, so one pass over them suffices)."""
    parts: list[tuple[int, list[int]]] = []
    for i, k in enumerate(key):
        bits = 0
        for x in k[2]:
            bits |= 1 << x
        for x in k[3]:
            bits |= 1 << x
        merged = [i]
        kept: list[tuple[int, list[int]]] = []
        for part_bits, members in parts:
            if part_bits & bits:
                bits |= part_bits
                merged += members
            else:
                kept.append((part_bits, members))
        merged.sort()
        kept.append((bits, merged))
        parts = kept
    out = [members for _, members in parts]
    out.sort(key=itemgetter(0))
    return out


def _joined(key: tuple, parts: list[list[int]]) -> _Shape:
    """A disconnected group's shape from its parts' (see the module contract). Each part is
    analysed under its own key (nodes renamed by first use, so equal parts share the memo);
    the window holds one period of every part, each from its own start (t0 = 0)."""
    n = len(key)
    iteration = [0.0] * n
    period = 0.0
    busy = [0.0, 0.0]  # utilization x nodes, per pool
    sizes = [0, 0]
    window = []
    for part in parts:
        sub, rename = _part_key(key, part)
        shape = _simulated(sub)
        back = {str(v): str(k) for k, v in rename.items()}
        for local, i in enumerate(part):
            iteration[i] = shape.iteration_s[local]
        period = max(period, shape.period)
        pool_sizes = _layout_of(sub).pool_sizes
        for p in range(2):
            busy[p] += shape.utilization[p] * pool_sizes[p]
            sizes[p] += pool_sizes[p]
        window += [(part[i], pool, tuple(back[x] for x in nodes), s - shape.t0, sw, e - shape.t0)
                   for i, pool, nodes, s, sw, e in shape.window]
    util = (busy[0] / sizes[0] if sizes[0] else 0.0, busy[1] / sizes[1] if sizes[1] else 0.0)
    window.sort(key=itemgetter(3))
    return _Shape(period, tuple(iteration), util, window, 0)


class _Layout(NamedTuple):
    """What a group's pinning pattern fixes, per phase slot ``s = 2 i + pool`` (pool 0: rollout).

    Nodes are bits of ``mask``. Which job each node ran last is one int, bit
    ``node * n + i`` set when member i was the last on that node: a phase ending on slot
    s sets that node field to i with ``last & keep[s] | own[s]``; it pays its switch
    when ``last & others[s]``, i.e. one of its nodes last ran another member.
    """

    shift: int  # slot bits: a heap or queue entry is ``time << shift | slot``
    mask: list[int]
    own: list[int]
    others: list[int]
    keep: list[int]
    names: list[tuple[str, ...]]
    pools: tuple[str, ...]
    nodes: list[int]  # nodes per slot
    pool_sizes: tuple[int, int]


_layouts: dict[tuple, _Layout] = {}
_pins = itemgetter(2, 3)


def _layout(pins: tuple) -> _Layout:
    n = len(pins)
    node_count = 1 + max((x for member in pins for nodes in member for x in nodes), default=-1)
    member_bits = (1 << n) - 1
    all_fields = (1 << (node_count * n)) - 1
    mask, own, others, keep, names, counts = [], [], [], [], [], []
    pool_masks = [0, 0]
    for i, member in enumerate(pins):
        for p, nodes in enumerate(member):
            m = mine = fields = 0
            for x in nodes:
                m |= 1 << x
                mine |= 1 << (x * n + i)
                fields |= member_bits << (x * n)
            pool_masks[p] |= m
            mask.append(m)
            own.append(mine)
            others.append(fields ^ mine)
            keep.append(all_fields ^ fields)
            names.append(tuple(map(str, nodes)))
            counts.append(len(nodes))
    return _Layout((2 * n - 1).bit_length(), mask, own, others, keep, names, POOLS * n, counts,
                   (pool_masks[0].bit_count(), pool_masks[1].bit_count()))


class _Setup(NamedTuple):
    """What ``_simulate`` derives from a key alone (the same for every start of it)."""

    layout: _Layout
    length: list[int]  # ticks per slot
    switch: list[int]
    switched: list[int]  # length + switch
    anchor: int  # the rollout slot of the member with the longest solo iteration
    step_limit: int
    train: int  # the offset that sorts training entries after every rollout entry
    requeue: list[int]  # a phase ending on slot s requeues its member's other phase at end + requeue[s]


_setups: dict[tuple, object] = {}  # a key's _Setup, or the C loop's prepared set-up of it
_SETUP_LIMIT = 4096  # keys in a row: the starts of one key come one after another


def _layout_of(key: tuple) -> _Layout:
    """The layout of ``key``'s pinning pattern, from ``_layouts`` or made and kept there."""
    pins = tuple(map(_pins, key))
    layout = _layouts.get(pins)
    if layout is None:
        if len(_layouts) >= _MEMO_LIMIT:
            _layouts.clear()
        layout = _layouts[pins] = _layout(pins)
    return layout


def _ticks(key: tuple, first: int) -> list[int]:
    """Per slot (2 i + pool), the ticks of member i's field ``first + pool`` (0: durations, 4: switches)."""
    return [round(k[first + p] * TICKS_PER_S) for k in key for p in (0, 1)]


def _keep_setup(key: tuple, setup: object) -> None:
    if len(_setups) >= _SETUP_LIMIT:
        _setups.clear()
    _setups[key] = setup


def _setup(key: tuple) -> _Setup:
    n = len(key)
    layout = _layout_of(key)
    length = _ticks(key, 0)
    switch = _ticks(key, 4)
    anchor = 0
    for s in range(2, 2 * n, 2):
        if length[s] + length[s + 1] > length[anchor] + length[anchor + 1]:
            anchor = s
    step_limit = 4 * MAX_ITERATIONS * n + 100
    # times stay below horizon (a step advances by at most one phase), so the training
    # entries, offset by train, sort after every rollout entry
    horizon = (step_limit + 2) * (max(length) + max(switch) + 1)
    train = 1 << (horizon.bit_length() + layout.shift)
    setup = _Setup(layout, length, switch, [d + sw for d, sw in zip(length, switch)], anchor, step_limit, train,
                   [train + 1, -1] * n)
    _keep_setup(key, setup)
    return setup


def _simulate(key: tuple, train_first: int = 0, joins: dict | None = None, pairs: set | None = None) -> _Shape:
    """Run the rule in integer microsecond ticks, so that a repeated state is seen exactly.

    Every member is ready at 0: for rollout, or for training when its bit of
    ``train_first`` is set (bit i: member i), as ``GroupExecutor.restore`` with a member
    queued for training would have it.

    ``joins``, when given, maps snapshot states of earlier runs of the same key (other
    starts) to the steady state each run found, with the snapshots and steps from that
    state to the repeat that this run would see (the first state it meets twice: the
    cycle's entry if the state is before the cycle, else the state itself). The rule is
    deterministic, so a run that reaches one of those states would settle into the same
    steady state; if it would also see the repeat within its limits, it stops there and
    returns that steady state: the same period, iteration times and utilizations as
    running on (window and ``t0`` are the earlier run's: ``_windowed``'s empty window
    where that run started otherwise than all ready for rollout). A run that finds a repeat adds
    its states; one that falls back adds none.

    ``pairs``, when given, collects every pair of members (i, j), i < j, whose admission
    order this run consulted: two entries of one queue ready at the same instant, with a
    node in common, met in a dispatch (the dispatch then served i's first). Entries of
    one instant with no node in common commute: each one's grant or reservation leaves
    the other's unchanged, and what later entries see is their union. Completions of one
    instant never share a node (a node runs one phase at a time), so their order is
    immaterial. So every run of this key whose admission order agrees with this one on
    these pairs (and that starts the same way) makes the same choices at every step and
    settles into the same schedule. A run that joins an earlier one adds that run's
    pairs (or (-1, -1), unknown, when that run collected none).

    A specialised copy of ``GroupExecutor`` (checked against it by
    tests/test_intra_kernel.py): member i is job ``str(i)``, admitted i-th, so FCFS ties
    break by index. Running phases are a heap of ``end << shift | slot``; the two queues
    are one sorted list of ``ready << shift | slot``, training entries offset by ``train``
    so that the rollout queue comes first. A phase ending at ``e`` requeues its member's
    other phase as ``e + requeue[slot]``. The state seen at a snapshot (heap and queue
    relative to now, ``last``) is equal exactly when ``GroupExecutor``'s is. Durations
    and switch seconds are >= 0 (the job contract), so time never goes back.
    """
    n = len(key)
    prepared = _setups.get(key)
    if prepared is None:
        prepared = _prepare(key)
    if not isinstance(prepared, _Setup):
        return _simulate_c(key, prepared, train_first, joins, pairs)
    layout, length, switch, switched, anchor, step_limit, train, requeue = prepared
    shift, mask, own, others, keep, names, pools, _, _ = layout
    low = (1 << shift) - 1
    queue = sorted(train + 2 * i + 1 if train_first >> i & 1 else 2 * i for i in range(n))
    running: list[int] = []
    spans: list[tuple[int, str, tuple[str, ...], int, int, int]] = []
    append = spans.append
    push, pop = heapq.heappush, heapq.heappop
    seen: dict[tuple, tuple[int, int, int, int, int]] = {}  # state -> now, spans marks, snapshot, step
    busy = last = now = starts0 = 0
    snap_step = -1
    block = -1  # the instant (and queue) of the entries in ``met``
    met: list[int] = []
    for step in range(step_limit + 1):
        if step:  # apply every completion at the next instant (a dispatch leaves one running)
            e = pop(running)
            now = e >> shift
            limit = e | low
            while True:
                s = e & low
                busy ^= mask[s]
                last = last & keep[s] | own[s]
                insort(queue, e + requeue[s])
                if not running or running[0] > limit:
                    break
                e = pop(running)
        first = len(spans)
        held = 0
        waiting = []
        for e in queue:  # dispatch: rollout queue, then training queue, FCFS, reserving
            s = e & low
            m = mask[s]
            if pairs is not None:
                if e >> shift != block:
                    block = e >> shift
                    met = [s]
                else:
                    for t in met:
                        if mask[t] & m:
                            pairs.add((t >> 1, s >> 1))
                    met.append(s)
            if (busy | held) & m:
                held |= m
                waiting.append(e)
                continue
            busy |= m
            if last & others[s]:  # one of its nodes last ran another member
                sw = switch[s]
                end = now + switched[s]
            else:
                sw = 0
                end = now + length[s]
            push(running, end << shift | s)
            append((s >> 1, pools[s], names[s], now, sw, end))
            if s == anchor:
                starts0 += 1
                snap_step = step
        queue = waiting
        block = -1
        # (the anchor's first start, before any phase ended, can't recur: at the later
        # ones its rollout nodes have a last job)
        if snap_step == step and (last or not mask[anchor]):
            rel = (now << shift).__rsub__
            state = (*sorted(map(rel, running)), None, *map(rel, queue), last)
            if joins is not None and state in joins:
                shape, snaps_left, steps_left, earlier = joins[state]
                if starts0 + snaps_left - 1 <= MAX_ITERATIONS and step + steps_left <= step_limit:
                    if pairs is not None:
                        pairs.update(earlier if earlier is not None else ((-1, -1),))
                    return shape
            prev = seen.get(state)
            if prev is not None:
                t0, span0, mark0, snap0, step0 = prev
                # running phases match, so each member ended as many trainings as it started
                iters = [0] * n
                for span in spans[mark0:]:
                    if span[1] == TRAIN:
                        iters[span[0]] += 1
                while first > span0 and spans[first - 1][3] == now:  # a zero-length phase ran at now
                    first -= 1
                shape = _windowed(_finish(now - t0, iters, spans[span0:first], t0, length, layout), train_first)
                if joins is not None:
                    for x, (*_, snap, at) in seen.items():
                        joins[x] = ((shape, starts0 - snap, step - at, pairs) if snap < snap0 else
                                    (shape, starts0 - snap0, step - step0, pairs))
                return shape
            start = first  # the window holds the phases started in [t0, now): also those that
            while start and spans[start - 1][3] == now:  # started at now before a zero-length one ended
                start -= 1
            seen[state] = (now, start, len(spans), starts0, step)
            if starts0 > MAX_ITERATIONS:
                break
    return _floored(_windowed(_fallback(spans, now, n, length, layout), train_first), key)


def _windowed(shape: _Shape, train_first: int) -> _Shape:
    """``shape`` as kept: with its window from the start with every member ready for
    rollout, with an empty one from any other (only its iteration times are read, by
    ``worst_iterations``; building the window cost more than the run)."""
    return _Shape(shape.period, shape.iteration_s, shape.utilization, [], shape.t0) if train_first else shape


def _prepare(key: tuple) -> object:
    """The C loop's set-up of ``key`` (``_csim.prepare``: what ``_setup`` and ``_layout``
    derive, in machine words) where the loop is built and the group fits, else the
    Python loop's ``_setup``; kept in ``_setups`` either way."""
    prepared = _csim.prepare(key, MAX_ITERATIONS, POOLS) if _csim is not None else None
    if prepared is None:
        return _setup(key)
    _keep_setup(key, prepared)
    return prepared


def _simulate_c(key: tuple, prepared: object, train_first: int, joins: dict | None, pairs: set | None) -> _Shape:
    """``_simulate`` with its loop in C (``_csim.c``): the same steps and the shape as
    ``_finish`` (a repeat) or ``_fallback`` (none) computes it; here what follows
    (``joins`` filled, a fallback's floors)."""
    out = _csim.simulate(prepared, train_first, joins, pairs)
    if out[0] == 0:  # met a state of an earlier run of this key
        joined: _Shape = out[1]
        return joined
    if out[0] == 1:  # a repeat: the shape as ``_finish`` computes it
        period, iteration, util, window, t0, seen, starts0, step, snap0, step0 = out[1:]
        shape = _Shape(period, iteration, util, window, t0)
        if joins is not None:
            for x, snap, at in seen:
                joins[x] = ((shape, starts0 - snap, step - at, pairs) if snap < snap0 else
                            (shape, starts0 - snap0, step - step0, pairs))
        return shape
    return _floored(_Shape(*out[1:]), key)  # no repeat: ``_fallback``'s shape


def _floored(shape: _Shape, key: tuple) -> _Shape:
    """A fallback shape with each member's iteration raised to its ``peer_floors``
    component floor (of the durations in ticks, as run) where the second-half estimate is
    below it: the floor bounds the long-run iteration of every schedule, so the estimate
    only moves towards the truth, and a check that rejects on the floor agrees with the
    analysis (the planner's ``_peer_miss``)."""
    ticks = [(round(k[0] * TICKS_PER_S), round(k[1] * TICKS_PER_S), k[2], k[3], round(k[4] * TICKS_PER_S),
              round(k[5] * TICKS_PER_S)) for k in key]
    floors = peer_floors(ticks)  # in ticks: the durations the run used
    if not any(floors):
        return shape
    iteration = tuple(it if f is None else max(it, f[1] / TICKS_PER_S) for it, f in zip(shape.iteration_s, floors))
    return _Shape(shape.period, iteration, shape.utilization, shape.window, shape.t0)


def peer_floors(rows: Sequence[tuple]) -> list[tuple[float, float] | None]:
    """Floors of synchronous members' iterations from the turns that peers take.

    ``rows`` are (t_roll, t_train, rollout nodes, training nodes, switch_roll,
    switch_train), one per member (a synchronous ``analyze`` key's entries, or profiles'
    fields). Two members are *peers* when they share a rollout node and a training node;
    only members with disjoint rollout and training nodes and both phases at least one
    tick take part (others have no floor here). Returns per member None (no peer) or
    (gap floor, component floor).

    Claim 1 (turns). Peers A and B alternate: between two trainings of A there is a
    training of B, and between two rollouts of A a rollout of B. Proof for trainings:
    let A's training end at t1 (it ran on a training node n of B's). At t1 B is (a)
    queued for training: its entry is older than A's next training entry (A's rollout
    takes a tick), so, FCFS with a waiting entry reserving its nodes, B takes n first;
    (b) queued for or running rollout: its rollout holds or is ahead of A's on their
    common rollout node, so A's rollout starts after B's ends, B queues for training
    first and runs first as in (a). B cannot be training at t1 (n). Rollouts: the same
    with the pools swapped (at A's rollout end B is queued for rollout, ahead; or queued
    for or running training on n, ahead of A's training, so it queues for rollout
    first). Hence every phase of a member with a peer pays its switch seconds: a peer
    ran on one of its nodes since its previous phase there (a first phase of the
    repeating window has a previous one, or a node whose last job is another's, as
    the window's state repeats).

    Claim 2 (gap floor). Between two consecutive training ends of A lie A's rollout,
    then its training, and before that training, on each training node n of A, one
    training of every peer B that trains on n (Claim 1, each within the gap since it
    must end before A's training takes n). So every gap is at least

        g_A = max(R_A + s_rA, max_n sum_{B peer on n} (T_B + s_tB)) + T_A + s_tA,

    and so is the mean gap of the fallback and a periodic window's iteration.

    Claim 3 (component floor). Peers alternate, so in a repeating window every member of
    a connected component C of the peer relation completes the same number c of
    iterations, and its iteration is period / c. Every phase pays its switch (Claim 1),
    and phases on a node never overlap, so for every node x

        iter_C >= F_C = max( max_x sum_{k in C on x} (d_k(x) + s_k(x)),  max_{k in C} (R_k + s_rk + T_k + s_tk) ).

    The same holds for the long-run rate of any schedule. A run without a repeat is
    measured over its second half, where counts in C may differ by the component's
    diameter; ``_floored`` raises that estimate to F_C, so the analysis reports
    iter >= F_C for every member of C, either way. Durations are rounded to ticks in
    the analysis: callers compare with a slack (the planner's ``_TICK_SLACK``)."""
    n = len(rows)
    sets: list[tuple[set, set] | None] = []  # (rollout nodes, training nodes) of the members taking part
    for r in rows:
        roll, train = set(r[2]), set(r[3])
        sets.append((roll, train) if min(r[0], r[1]) >= 1e-6 and roll and train and roll.isdisjoint(train) else None)
    peers: list[list[int]] = [[] for _ in range(n)]
    for i, si in enumerate(sets):
        for j in range(i + 1, n):
            sj = sets[j]
            if si is not None and sj is not None and not si[0].isdisjoint(sj[0]) and not si[1].isdisjoint(sj[1]):
                peers[i].append(j)
                peers[j].append(i)
    if not any(peers):
        return [None] * n
    seen = [False] * n
    floors: list[tuple[float, float] | None] = [None] * n
    for start in range(n):
        if seen[start] or not peers[start]:
            continue
        members, stack = [], [start]
        seen[start] = True
        while stack:
            i = stack.pop()
            members.append(i)
            for j in peers[i]:
                if not seen[j]:
                    seen[j] = True
                    stack.append(j)
        load: dict = {}
        cycle = 0.0
        for i in members:
            r = rows[i]
            d_roll, d_train = r[0] + r[4], r[1] + r[5]
            cycle = max(cycle, d_roll + d_train)
            for x in r[2]:
                load[x] = load.get(x, 0.0) + d_roll
            for x in r[3]:
                load[x] = load.get(x, 0.0) + d_train
        floor = max(cycle, max(load.values()))
        for i in members:
            r = rows[i]
            wait = max(sum(rows[j][1] + rows[j][5] for j in peers[i] if x in rows[j][3]) for x in r[3])
            floors[i] = (max(r[0] + r[4], wait) + r[1] + r[5], floor)
    return floors


def _finish(period_ticks, iters, window, t0, length, layout) -> _Shape:
    period = period_ticks / TICKS_PER_S
    iteration = tuple([period / k if k > 0 else float("inf") for k in iters])
    nodes = layout.nodes
    roll = train = 0
    for span in window:
        s = 2 * span[0]
        if span[1] == ROLLOUT:
            roll += length[s] * nodes[s]
        else:
            train += length[s + 1] * nodes[s + 1]
    rolls, trains = layout.pool_sizes
    util = (roll / (rolls * period_ticks), train / (trains * period_ticks)) if period_ticks > 0 else (0.0, 0.0)
    return _Shape(period, iteration, util, window, t0)


def _fallback(spans, now, n, length, layout) -> _Shape:
    """No repeat found: measure each member's rate over the second half of the run.

    A member's iteration time is the mean gap between its training ends in that half;
    one with fewer than two ends there is reported as starved (infinite).
    """
    half = now // 2
    window = [s for s in spans if s[3] >= half and s[5] <= now]
    ends: list[list[int]] = [[] for _ in range(n)]
    for i, pool, _, _, _, end in window:
        if pool == TRAIN:
            ends[i].append(end)
    shape = _finish(now - half, (0,) * n, window, half, length, layout)
    iteration = tuple((e[-1] - e[0]) / (len(e) - 1) / TICKS_PER_S if len(e) > 1 else float("inf") for e in ends)
    return _Shape(shape.period, iteration, shape.utilization, shape.window, shape.t0)
