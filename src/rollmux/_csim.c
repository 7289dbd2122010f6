/* The execution rule's simulation loop in C: rollmux.kernel._simulate's loop, step for step.
 *
 * rollmux.kernel prepares everything from the key (its _Setup and _Layout) and calls
 * simulate() when the group fits machine words (see kernel._setup: nodes x members
 * <= 63 bits of ``last``, times below 2^62 with their slot and queue offset); else it
 * runs its own Python loop. The two must agree exactly: the tests run every property
 * test of tests/test_intra_kernel.py through this loop and compare it with the Python
 * one (tests/test_csim.py).
 *
 * simulate(n, shift, step_limit, anchor, max_iterations, mask, own, others, keep,
 *          length, switch, switched, requeue, queue, names, pools, nodes, pool_sizes, joins, pairs)
 * returns one of
 *   (0, shape)                                   a state of ``joins`` was met: its shape
 *   (1, period, iteration, utilization, window, t0, seen, starts0, step, snap0, step0)
 *                                                a state repeated: the fields of the
 *                                                shape (kernel._finish's arithmetic,
 *                                                its int divisions by Python);
 *                                                ``seen`` lists (state, starts0 then,
 *                                                step then) when ``joins`` is given,
 *                                                else None
 *   (2, now, spans)                              no repeat: the spans of the second half
 * with the pairs of members whose order it consulted added to ``pairs`` (a set) when
 * given. Spans are (member, pool, nodes, start, switch, end) tuples, as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t start, sw, end;
    int slot;
} Span;

typedef struct {
    int64_t *values; /* running (sorted), then queue; relative to now */
    int nrun, nqueue;
    uint64_t last;
    int64_t now;
    Py_ssize_t start, nspans;
    long starts0, step;
    PyObject *key; /* the Python state tuple, when joins is given */
} Seen;

typedef struct {
    int n, shift, anchor, step_limit, max_iterations;
    int64_t low;
    uint64_t *mask, *own, *others, *keep;
    int64_t *length, *switch_, *switched, *requeue, *nodes;
    long long rolls, trains;
    PyObject *names, *pools;
} Setup;

static int read_u64(PyObject *list, int count, uint64_t *out) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != count) {
        PyErr_SetString(PyExc_TypeError, "expected a list of the group's slots");
        return -1;
    }
    for (int i = 0; i < count; i++) {
        out[i] = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(list, i));
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

static int read_i64(PyObject *list, int count, int64_t *out) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != count) {
        PyErr_SetString(PyExc_TypeError, "expected a list of the group's slots");
        return -1;
    }
    for (int i = 0; i < count; i++) {
        out[i] = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* min-heap of int64 */
static void heap_push(int64_t *h, int *size, int64_t v) {
    int i = (*size)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (h[parent] <= v) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = v;
}

static int64_t heap_pop(int64_t *h, int *size) {
    int64_t top = h[0];
    int64_t v = h[--(*size)];
    int i = 0, n = *size;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (n > 0) h[i] = v;
    return top;
}

static void insort(int64_t *q, int *size, int64_t v) {
    int i = (*size)++;
    while (i > 0 && q[i - 1] > v) {
        q[i] = q[i - 1];
        i--;
    }
    q[i] = v;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static PyObject *span_tuple(const Setup *s, const Span *sp) {
    PyObject *t = PyTuple_New(6);
    if (!t) return NULL;
    PyObject *nodes = PyList_GET_ITEM(s->names, sp->slot);
    PyObject *pool = PyTuple_GET_ITEM(s->pools, sp->slot);
    Py_INCREF(nodes);
    Py_INCREF(pool);
    PyTuple_SET_ITEM(t, 0, PyLong_FromLong(sp->slot >> 1));
    PyTuple_SET_ITEM(t, 1, pool);
    PyTuple_SET_ITEM(t, 2, nodes);
    PyTuple_SET_ITEM(t, 3, PyLong_FromLongLong(sp->start));
    PyTuple_SET_ITEM(t, 4, PyLong_FromLongLong(sp->sw));
    PyTuple_SET_ITEM(t, 5, PyLong_FromLongLong(sp->end));
    for (int k = 0; k < 6; k++)
        if (!PyTuple_GET_ITEM(t, k)) {
            Py_DECREF(t);
            return NULL;
        }
    return t;
}

static PyObject *spans_list(const Setup *s, const Span *spans, Py_ssize_t from, Py_ssize_t to) {
    PyObject *out = PyList_New(to - from);
    if (!out) return NULL;
    for (Py_ssize_t k = from; k < to; k++) {
        PyObject *t = span_tuple(s, &spans[k]);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k - from, t);
    }
    return out;
}

static PyObject *state_key(const int64_t *values, int nrun, int nqueue, uint64_t last) {
    PyObject *key = PyTuple_New(nrun + nqueue + 2);
    if (!key) return NULL;
    Py_ssize_t k = 0;
    for (int i = 0; i < nrun; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (!v) goto fail;
        PyTuple_SET_ITEM(key, k++, v);
    }
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(key, k++, Py_None);
    for (int i = 0; i < nqueue; i++) {
        PyObject *v = PyLong_FromLongLong(values[nrun + i]);
        if (!v) goto fail;
        PyTuple_SET_ITEM(key, k++, v);
    }
    PyObject *l = PyLong_FromUnsignedLongLong(last);
    if (!l) goto fail;
    PyTuple_SET_ITEM(key, k, l);
    return key;
fail:
    Py_DECREF(key);
    return NULL;
}

static int flush_pairs(PyObject *pairs, const unsigned char *met_pairs, int n) {
    if (pairs == Py_None) return 0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            if (met_pairs[a * n + b]) {
                PyObject *t = Py_BuildValue("(ii)", a, b);
                if (!t || PySet_Add(pairs, t) < 0) {
                    Py_XDECREF(t);
                    return -1;
                }
                Py_DECREF(t);
            }
    return 0;
}

/* The node-ticks busy in spans[from:to] of one pool (0 rollout, 1 training): the sum of
 * length x nodes of their slots, as a Python int (machine words while they suffice). */
static PyObject *busy_ticks(const Setup *s, const Span *spans, Py_ssize_t from, Py_ssize_t to, int pool) {
    int64_t sum = 0;
    Py_ssize_t k = from;
    for (; k < to; k++) {
        int sl = spans[k].slot;
        int64_t term;
        if ((sl & 1) != pool) continue;
        if (__builtin_mul_overflow(s->length[sl], s->nodes[sl], &term) || __builtin_add_overflow(sum, term, &sum))
            break;
    }
    if (k == to) return PyLong_FromLongLong(sum);
    PyObject *total = PyLong_FromLong(0); /* too large for a word: Python ints throughout */
    for (k = from; total && k < to; k++) {
        int sl = spans[k].slot;
        if ((sl & 1) != pool) continue;
        PyObject *a = PyLong_FromLongLong(s->length[sl]), *b = PyLong_FromLongLong(s->nodes[sl]);
        PyObject *term = a && b ? PyNumber_Multiply(a, b) : NULL;
        PyObject *next = term ? PyNumber_Add(total, term) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(term);
        Py_SETREF(total, next);
    }
    return total;
}

/* busy / (nodes x period) with Python's true division of ints. */
static PyObject *exact_share(PyObject *busy, long long nodes, int64_t period_ticks) {
    PyObject *a = PyLong_FromLongLong(nodes), *b = PyLong_FromLongLong(period_ticks);
    PyObject *den = a && b ? PyNumber_Multiply(a, b) : NULL;
    PyObject *out = den ? PyNumber_TrueDivide(busy, den) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(den);
    return out;
}

static PyObject *simulate(PyObject *self, PyObject *args) {
    Setup s;
    PyObject *mask, *own, *others, *keep, *length, *switch_, *switched, *requeue, *queue0, *nodes, *joins, *pairs;
    if (!PyArg_ParseTuple(args, "iiiiiO!O!O!O!O!O!O!O!O!O!O!O!(LL)OO", &s.n, &s.shift, &s.step_limit, &s.anchor,
                          &s.max_iterations, &PyList_Type, &mask, &PyList_Type, &own, &PyList_Type, &others,
                          &PyList_Type, &keep, &PyList_Type, &length, &PyList_Type, &switch_, &PyList_Type, &switched,
                          &PyList_Type, &requeue, &PyList_Type, &queue0, &PyList_Type, &s.names, &PyTuple_Type,
                          &s.pools, &PyList_Type, &nodes, &s.rolls, &s.trains, &joins, &pairs))
        return NULL;
    int n = s.n, slots = 2 * n;
    if (n < 1 || n > 63 || s.shift < 1 || s.shift > 8 || PyList_GET_SIZE(queue0) != n ||
        PyList_GET_SIZE(s.names) != slots || PyTuple_GET_SIZE(s.pools) != slots) {
        PyErr_SetString(PyExc_ValueError, "simulate: inconsistent group set-up");
        return NULL;
    }
    if (joins != Py_None && !PyDict_Check(joins)) {
        PyErr_SetString(PyExc_TypeError, "simulate: joins must be a dict or None");
        return NULL;
    }
    if (pairs != Py_None && !PySet_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "simulate: pairs must be a set or None");
        return NULL;
    }
    s.low = ((int64_t)1 << s.shift) - 1;

    PyObject *result = NULL;
    uint64_t *words = PyMem_Calloc(4 * (size_t)slots, sizeof(uint64_t));
    int64_t *ints = PyMem_Calloc(5 * (size_t)slots + 3 * (size_t)n + 2, sizeof(int64_t));
    unsigned char *met_pairs = PyMem_Calloc((size_t)n * n, 1);
    int *met = PyMem_Calloc((size_t)n + 1, sizeof(int));
    Py_ssize_t span_cap = 256, nspans = 0;
    Span *spans = PyMem_Malloc(span_cap * sizeof(Span));
    int seen_cap = s.max_iterations + 4, nseen = 0;
    Seen *seen = PyMem_Calloc((size_t)seen_cap, sizeof(Seen));
    if (!words || !ints || !met_pairs || !met || !spans || !seen) {
        PyErr_NoMemory();
        goto done;
    }
    s.mask = words;
    s.own = words + slots;
    s.others = words + 2 * slots;
    s.keep = words + 3 * slots;
    s.length = ints;
    s.switch_ = ints + slots;
    s.switched = ints + 2 * slots;
    s.requeue = ints + 3 * slots;
    s.nodes = ints + 4 * slots;
    int64_t *running = ints + 5 * slots;
    int64_t *queue = running + n + 1;
    int64_t *waiting = queue + n + 1;
    if (read_u64(mask, slots, s.mask) || read_u64(own, slots, s.own) || read_u64(others, slots, s.others) ||
        read_u64(keep, slots, s.keep) || read_i64(length, slots, s.length) || read_i64(switch_, slots, s.switch_) ||
        read_i64(switched, slots, s.switched) || read_i64(requeue, slots, s.requeue) ||
        read_i64(nodes, slots, s.nodes) || read_i64(queue0, n, queue))
        goto done;

    int nrun = 0, nqueue = n;
    uint64_t busy = 0, last = 0;
    int64_t now = 0;
    long starts0 = 0, snap_step = -1;
    int64_t block = -1;
    int nmet = 0;
    int64_t *state = PyMem_Malloc(((size_t)n + 1) * sizeof(int64_t));
    if (!state) {
        PyErr_NoMemory();
        goto done;
    }
    for (long step = 0; step <= s.step_limit; step++) {
        if (step) { /* apply every completion at the next instant */
            if (nrun == 0) { /* cannot happen: a dispatch always leaves a phase running */
                PyErr_SetString(PyExc_RuntimeError, "simulate: no phase running");
                goto done_state;
            }
            int64_t e = heap_pop(running, &nrun);
            now = e >> s.shift;
            int64_t limit = e | s.low;
            for (;;) {
                int sl = (int)(e & s.low);
                busy ^= s.mask[sl];
                last = (last & s.keep[sl]) | s.own[sl];
                insort(queue, &nqueue, e + s.requeue[sl]);
                if (nrun == 0 || running[0] > limit) break;
                e = heap_pop(running, &nrun);
            }
        }
        Py_ssize_t first = nspans;
        uint64_t held = 0;
        int nwait = 0;
        for (int k = 0; k < nqueue; k++) { /* dispatch: rollout queue, then training queue, FCFS, reserving */
            int64_t e = queue[k];
            int sl = (int)(e & s.low);
            uint64_t m = s.mask[sl];
            if (pairs != Py_None) {
                if ((e >> s.shift) != block) {
                    block = e >> s.shift;
                    met[0] = sl;
                    nmet = 1;
                } else {
                    for (int j = 0; j < nmet; j++)
                        if (s.mask[met[j]] & m) met_pairs[(met[j] >> 1) * n + (sl >> 1)] = 1;
                    met[nmet++] = sl;
                }
            }
            if ((busy | held) & m) {
                held |= m;
                waiting[nwait++] = e;
                continue;
            }
            busy |= m;
            int64_t sw, end;
            if (last & s.others[sl]) {
                sw = s.switch_[sl];
                end = now + s.switched[sl];
            } else {
                sw = 0;
                end = now + s.length[sl];
            }
            heap_push(running, &nrun, (end << s.shift) | sl);
            if (nspans == span_cap) {
                span_cap *= 2;
                Span *grown = PyMem_Realloc(spans, span_cap * sizeof(Span));
                if (!grown) {
                    PyErr_NoMemory();
                    goto done_state;
                }
                spans = grown;
            }
            spans[nspans].start = now;
            spans[nspans].sw = sw;
            spans[nspans].end = end;
            spans[nspans].slot = sl;
            nspans++;
            if (sl == s.anchor) {
                starts0++;
                snap_step = step;
            }
        }
        memcpy(queue, waiting, (size_t)nwait * sizeof(int64_t));
        nqueue = nwait;
        block = -1;
        if (snap_step == step && (last || !s.mask[s.anchor])) {
            int64_t base = now << s.shift;
            for (int k = 0; k < nrun; k++) state[k] = running[k] - base;
            qsort(state, (size_t)nrun, sizeof(int64_t), cmp_i64);
            for (int k = 0; k < nqueue; k++) state[nrun + k] = queue[k] - base;
            PyObject *key = NULL;
            if (joins != Py_None) {
                key = state_key(state, nrun, nqueue, last);
                if (!key) goto done_state;
                PyObject *hit = PyDict_GetItemWithError(joins, key); /* borrowed */
                if (!hit && PyErr_Occurred()) {
                    Py_DECREF(key);
                    goto done_state;
                }
                if (hit) {
                    Py_INCREF(hit);
                    long snaps_left = PyLong_AsLong(PyTuple_GET_ITEM(hit, 1));
                    long steps_left = PyLong_AsLong(PyTuple_GET_ITEM(hit, 2));
                    if (PyErr_Occurred()) {
                        Py_DECREF(hit);
                        Py_DECREF(key);
                        goto done_state;
                    }
                    if (starts0 + snaps_left - 1 <= s.max_iterations && step + steps_left <= s.step_limit) {
                        Py_DECREF(key);
                        int failed = 0;
                        if (pairs != Py_None) {
                            PyObject *earlier = PyTuple_GET_ITEM(hit, 3);
                            if (earlier == Py_None) {
                                PyObject *unknown = Py_BuildValue("(ii)", -1, -1);
                                failed = !unknown || PySet_Add(pairs, unknown) < 0;
                                Py_XDECREF(unknown);
                            } else {
                                PyObject *r = PyObject_CallMethod(pairs, "update", "O", earlier);
                                failed = !r;
                                Py_XDECREF(r);
                            }
                            failed = failed || flush_pairs(pairs, met_pairs, n) < 0;
                        }
                        if (!failed) result = Py_BuildValue("(iO)", 0, PyTuple_GET_ITEM(hit, 0));
                        Py_DECREF(hit);
                        goto done_state;
                    }
                    Py_DECREF(hit);
                }
            }
            int prev = -1;
            for (int k = 0; k < nseen && prev < 0; k++) {
                Seen *x = &seen[k];
                if (x->nrun == nrun && x->nqueue == nqueue && x->last == last &&
                    memcmp(x->values, state, (size_t)(nrun + nqueue) * sizeof(int64_t)) == 0)
                    prev = k;
            }
            if (prev >= 0) {
                Py_XDECREF(key);
                Seen *p = &seen[prev];
                int64_t period_ticks = now - p->now;
                double period = (double)period_ticks / 1e6;
                PyObject *iteration = PyTuple_New(n);
                if (!iteration) goto done_state;
                long *count = PyMem_Calloc((size_t)n, sizeof(long));
                if (!count) {
                    Py_DECREF(iteration);
                    PyErr_NoMemory();
                    goto done_state;
                }
                for (Py_ssize_t k = p->nspans; k < nspans; k++)
                    if (spans[k].slot & 1) count[spans[k].slot >> 1]++;
                for (int i = 0; i < n; i++)
                    PyTuple_SET_ITEM(iteration, i,
                                     PyFloat_FromDouble(count[i] > 0 ? period / (double)count[i] : Py_HUGE_VAL));
                PyMem_Free(count);
                while (first > p->start && spans[first - 1].start == now) first--;
                PyObject *util = NULL;
                if (period_ticks <= 0) {
                    util = Py_BuildValue("(dd)", 0.0, 0.0);
                } else { /* Python's exact int / int, as _finish: the same float, ZeroDivisionError alike */
                    PyObject *roll = busy_ticks(&s, spans, p->start, first, 0);
                    PyObject *train = roll ? busy_ticks(&s, spans, p->start, first, 1) : NULL;
                    PyObject *u0 = train ? exact_share(roll, s.rolls, period_ticks) : NULL;
                    PyObject *u1 = u0 ? exact_share(train, s.trains, period_ticks) : NULL;
                    if (u1) util = PyTuple_Pack(2, u0, u1);
                    Py_XDECREF(roll);
                    Py_XDECREF(train);
                    Py_XDECREF(u0);
                    Py_XDECREF(u1);
                }
                PyObject *window = util ? spans_list(&s, spans, p->start, first) : NULL;
                PyObject *seen_list = Py_None;
                Py_INCREF(Py_None);
                if (window && joins != Py_None) {
                    Py_DECREF(seen_list);
                    seen_list = PyList_New(nseen);
                    for (int k = 0; seen_list && k < nseen; k++)
                        PyList_SET_ITEM(seen_list, k, Py_BuildValue("(Oll)", seen[k].key, seen[k].starts0,
                                                                      seen[k].step));
                }
                if (window && seen_list && flush_pairs(pairs, met_pairs, n) == 0)
                    result = Py_BuildValue("(idOOOLOllll)", 1, period, iteration, util, window, (long long)p->now,
                                           seen_list, starts0, step, p->starts0, p->step);
                Py_XDECREF(util);
                Py_DECREF(iteration);
                Py_XDECREF(window);
                Py_XDECREF(seen_list);
                goto done_state;
            }
            Py_ssize_t start = first; /* the window holds the phases started in [t0, now) */
            while (start && spans[start - 1].start == now) start--;
            Seen *x = &seen[nseen];
            x->values = PyMem_Malloc(((size_t)nrun + nqueue + 1) * sizeof(int64_t));
            if (!x->values) {
                Py_XDECREF(key);
                PyErr_NoMemory();
                goto done_state;
            }
            memcpy(x->values, state, (size_t)(nrun + nqueue) * sizeof(int64_t));
            x->nrun = nrun;
            x->nqueue = nqueue;
            x->last = last;
            x->now = now;
            x->start = start;
            x->nspans = nspans;
            x->starts0 = starts0;
            x->step = step;
            x->key = key; /* owned */
            nseen++;
            if (starts0 > s.max_iterations || nseen == seen_cap) break;
        }
    }
    { /* no repeat: the second half's spans */
        int64_t half = now / 2;
        PyObject *out = PyList_New(0);
        for (Py_ssize_t k = 0; out && k < nspans; k++) {
            if (spans[k].start >= half && spans[k].end <= now) {
                PyObject *t = span_tuple(&s, &spans[k]);
                if (!t || PyList_Append(out, t) < 0) {
                    Py_XDECREF(t);
                    Py_CLEAR(out);
                    break;
                }
                Py_DECREF(t);
            }
        }
        if (out && flush_pairs(pairs, met_pairs, n) == 0) result = Py_BuildValue("(iLO)", 2, (long long)now, out);
        Py_XDECREF(out);
    }
done_state:
    PyMem_Free(state);
done:
    for (int k = 0; seen && k < nseen; k++) {
        PyMem_Free(seen[k].values);
        Py_XDECREF(seen[k].key);
    }
    PyMem_Free(seen);
    PyMem_Free(spans);
    PyMem_Free(met);
    PyMem_Free(met_pairs);
    PyMem_Free(ints);
    PyMem_Free(words);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS, "rollmux.kernel._simulate's loop (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csim", "The execution rule's loop in C.", -1, methods};

PyMODINIT_FUNC PyInit__csim(void) { return PyModule_Create(&module); }
