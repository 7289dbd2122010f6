/* The execution rule's simulation loop in C: rollmux.kernel._simulate's loop, step for step.
 *
 * prepare() derives from a key what kernel._setup and kernel._layout do, in machine
 * words, when the group fits them (nodes x members <= 63 bits of ``last``, times below
 * 2^62 with their slot and queue offset); rollmux.kernel keeps that set-up and runs
 * simulate() on it, else its own Python loop. The two must agree exactly: the tests run every property
 * test of tests/test_intra_kernel.py through this loop and compare it with the Python
 * one (tests/test_csim.py).
 *
 * simulate(prepared, train_first, joins, pairs) returns one of
 *   (0, shape)                                   a state of ``joins`` was met: its shape
 *   (1, period, iteration, utilization, window, t0, seen, starts0, step, snap0, step0)
 *                                                a state repeated: the fields of the
 *                                                shape (kernel._finish's arithmetic,
 *                                                its int divisions by Python);
 *                                                ``seen`` lists (state, starts0 then,
 *                                                step then) when ``joins`` is given,
 *                                                else None
 *   (2, period, iteration, utilization, window, t0)
 *                                                no repeat: kernel._fallback's shape (the
 *                                                second half's rates), before _floored
 * with the pairs of members whose order it consulted added to ``pairs`` (a set) when
 * given. The window is empty where train_first is not 0 (kernel._windowed). Spans are (member, pool, nodes, start, switch, end) tuples, as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
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
    int64_t low, train;
    uint64_t *mask, *own, *others, *keep;
    int64_t *length, *switch_, *switched, *requeue, *nodes;
    long long rolls, trains;
    PyObject *names, *pools;
} Setup;

#define CAPSULE "rollmux._csim.setup"

static void setup_release(Setup *s) {
    Py_XDECREF(s->names);
    Py_XDECREF(s->pools);
    PyMem_Free(s->mask);
    PyMem_Free(s->length);
    PyMem_Free(s);
}

static void setup_free(PyObject *capsule) {
    Setup *s = PyCapsule_GetPointer(capsule, CAPSULE);
    if (s) setup_release(s);
}

static int bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* round(x * 1e6) as Python computes it for a float or an int x (ties to even), when the
 * result is a finite integer below 2^52; else -1 (the key then runs the Python loop). */
static int64_t ticks(PyObject *x) {
    double v = PyFloat_AsDouble(x);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (PyLong_Check(x) && (v >= 4503599627370496.0 || v <= -4503599627370496.0)) return -1; /* int not exact */
    double t = nearbyint(v * 1e6);
    if (!(t >= 0.0 && t < 4503599627370496.0)) return -1;
    return (int64_t)t;
}

/* prepare(key, max_iterations, pools): kernel._setup and kernel._layout of a synchronous
 * key for this loop, or None where the group does not fit machine words (nodes x
 * members > 63 bits, times of 2^62 or more) or a field is not what the loop takes. */
static PyObject *prepare(PyObject *self, PyObject *args) {
    PyObject *key, *pools2;
    int max_iterations;
    if (!PyArg_ParseTuple(args, "O!iO!", &PyTuple_Type, &key, &max_iterations, &PyTuple_Type, &pools2)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(key);
    if (n < 1 || n > 63 || PyTuple_GET_SIZE(pools2) != 2) Py_RETURN_NONE;
    int slots = 2 * (int)n;
    int node_count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(key, i);
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 6) Py_RETURN_NONE;
        for (int pool = 0; pool < 2; pool++) {
            PyObject *nodes = PyTuple_GET_ITEM(k, 2 + pool);
            if (!PyTuple_Check(nodes)) Py_RETURN_NONE;
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(nodes); j++) {
                PyObject *x = PyTuple_GET_ITEM(nodes, j);
                if (!PyLong_CheckExact(x)) Py_RETURN_NONE;
                long v = PyLong_AsLong(x);
                if (v < 0 || v > 62) {
                    PyErr_Clear();
                    Py_RETURN_NONE;
                }
                if (v + 1 > node_count) node_count = (int)v + 1;
            }
        }
    }
    if ((long)node_count * n > 63) Py_RETURN_NONE;
    Setup *s = PyMem_Calloc(1, sizeof(Setup));
    if (!s) return PyErr_NoMemory();
    s->mask = PyMem_Calloc(4 * (size_t)slots, sizeof(uint64_t));
    s->length = PyMem_Calloc(5 * (size_t)slots, sizeof(int64_t));
    s->names = PyList_New(slots);
    s->pools = PyTuple_New(slots);
    PyObject *capsule = NULL;
    if (!s->mask || !s->length || !s->names || !s->pools) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto fail;
    }
    s->own = s->mask + slots;
    s->others = s->mask + 2 * slots;
    s->keep = s->mask + 3 * slots;
    s->switch_ = s->length + slots;
    s->switched = s->length + 2 * slots;
    s->requeue = s->length + 3 * slots;
    s->nodes = s->length + 4 * slots;
    s->n = (int)n;
    s->max_iterations = max_iterations;
    s->shift = bit_length((uint64_t)(2 * n - 1));
    s->low = ((int64_t)1 << s->shift) - 1;
    uint64_t member_bits = ((uint64_t)1 << n) - 1, all_fields = node_count * n == 64 ? ~(uint64_t)0
                                                                   : (((uint64_t)1 << (node_count * n)) - 1);
    uint64_t pool_masks[2] = {0, 0};
    int64_t max_length = 0, max_switch = 0;
    for (int i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(key, i);
        for (int pool = 0; pool < 2; pool++) {
            int sl = 2 * i + pool;
            int64_t d = ticks(PyTuple_GET_ITEM(k, pool)), sw = ticks(PyTuple_GET_ITEM(k, 4 + pool));
            if (d < 0 || sw < 0) goto not_native;
            s->length[sl] = d;
            s->switch_[sl] = sw;
            s->switched[sl] = d + sw;
            if (d > max_length) max_length = d;
            if (sw > max_switch) max_switch = sw;
            PyObject *nodes = PyTuple_GET_ITEM(k, 2 + pool);
            Py_ssize_t count = PyTuple_GET_SIZE(nodes);
            PyObject *names = PyTuple_New(count);
            if (!names) goto fail;
            PyList_SET_ITEM(s->names, sl, names);
            uint64_t m = 0, mine = 0, fields = 0;
            for (Py_ssize_t j = 0; j < count; j++) {
                long x = PyLong_AsLong(PyTuple_GET_ITEM(nodes, j));
                m |= (uint64_t)1 << x;
                mine |= (uint64_t)1 << (x * n + i);
                fields |= member_bits << (x * n);
                PyObject *name = PyUnicode_FromFormat("%ld", x);
                if (!name) goto fail;
                PyTuple_SET_ITEM(names, j, name);
            }
            pool_masks[pool] |= m;
            s->mask[sl] = m;
            s->own[sl] = mine;
            s->others[sl] = fields ^ mine;
            s->keep[sl] = all_fields ^ fields;
            s->nodes[sl] = count;
            PyObject *pool_name = PyTuple_GET_ITEM(pools2, pool);
            Py_INCREF(pool_name);
            PyTuple_SET_ITEM(s->pools, sl, pool_name);
        }
    }
    s->rolls = __builtin_popcountll(pool_masks[0]);
    s->trains = __builtin_popcountll(pool_masks[1]);
    s->anchor = 0;
    for (int sl = 2; sl < slots; sl += 2)
        if (s->length[sl] + s->length[sl + 1] > s->length[s->anchor] + s->length[s->anchor + 1]) s->anchor = sl;
    s->step_limit = 4 * max_iterations * (int)n + 100;
    int64_t horizon;
    if (__builtin_mul_overflow((int64_t)s->step_limit + 2, max_length + max_switch + 1, &horizon)) goto not_native;
    int train_bits = bit_length((uint64_t)horizon) + s->shift; /* train = 1 << train_bits */
    if (train_bits + 1 >= 62) goto not_native;                  /* kernel: train.bit_length() < 62 */
    s->train = (int64_t)1 << train_bits;
    for (int i = 0; i < n; i++) {
        s->requeue[2 * i] = s->train + 1;
        s->requeue[2 * i + 1] = -1;
    }
    capsule = PyCapsule_New(s, CAPSULE, setup_free);
    if (!capsule) goto fail;
    return capsule;
not_native:
    setup_release(s);
    Py_RETURN_NONE;
fail:
    setup_release(s);
    return NULL;
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

/* The utilizations of spans[from:to] over period_ticks, per pool: (0.0, 0.0) for an empty
 * period, else Python's exact int / int, as kernel._finish (the same floats, and
 * ZeroDivisionError alike). */
static PyObject *utilization(const Setup *s, const Span *spans, Py_ssize_t from, Py_ssize_t to,
                             int64_t period_ticks) {
    if (period_ticks <= 0) return Py_BuildValue("(dd)", 0.0, 0.0);
    PyObject *util = NULL;
    PyObject *roll = busy_ticks(s, spans, from, to, 0);
    PyObject *train = roll ? busy_ticks(s, spans, from, to, 1) : NULL;
    PyObject *u0 = train ? exact_share(roll, s->rolls, period_ticks) : NULL;
    PyObject *u1 = u0 ? exact_share(train, s->trains, period_ticks) : NULL;
    if (u1) util = PyTuple_Pack(2, u0, u1);
    Py_XDECREF(roll);
    Py_XDECREF(train);
    Py_XDECREF(u0);
    Py_XDECREF(u1);
    return util;
}

static PyObject *simulate(PyObject *self, PyObject *args) {
    PyObject *capsule, *joins, *pairs;
    unsigned long long train_first;
    if (!PyArg_ParseTuple(args, "OKOO", &capsule, &train_first, &joins, &pairs)) return NULL;
    Setup *prepared = PyCapsule_GetPointer(capsule, CAPSULE);
    if (!prepared) return NULL;
    Setup s = *prepared;
    int n = s.n;
    if (joins != Py_None && !PyDict_Check(joins)) {
        PyErr_SetString(PyExc_TypeError, "simulate: joins must be a dict or None");
        return NULL;
    }
    if (pairs != Py_None && !PySet_Check(pairs)) {
        PyErr_SetString(PyExc_TypeError, "simulate: pairs must be a set or None");
        return NULL;
    }

    PyObject *result = NULL;
    int64_t *work = PyMem_Calloc(3 * (size_t)n + 3, sizeof(int64_t));
    unsigned char *met_pairs = PyMem_Calloc((size_t)n * n, 1);
    int *met = PyMem_Calloc((size_t)n + 1, sizeof(int));
    Py_ssize_t span_cap = 256, nspans = 0;
    Span *spans = PyMem_Malloc(span_cap * sizeof(Span));
    int seen_cap = s.max_iterations + 4, nseen = 0;
    Seen *seen = PyMem_Malloc((size_t)seen_cap * sizeof(Seen)); /* entries below nseen only are read */
    if (!work || !met_pairs || !met || !spans || !seen) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *running = work;
    int64_t *queue = running + n + 1;
    int64_t *waiting = queue + n + 1;
    int nrun = 0, nqueue = 0; /* every member ready at 0: for training where its bit of train_first is set */
    for (int i = 0; i < n; i++)
        insort(queue, &nqueue, (train_first >> i & 1) ? s.train + 2 * i + 1 : 2 * i);

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
                PyObject *util = utilization(&s, spans, p->start, first, period_ticks);
                PyObject *window = !util ? NULL : train_first ? PyList_New(0) : spans_list(&s, spans, p->start, first);
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
    { /* no repeat: kernel._fallback's shape, measured over the second half */
        int64_t half = now / 2, period_ticks = now - half;
        PyObject *window = PyList_New(0), *iteration = PyTuple_New(n), *util = NULL;
        int64_t *first_end = PyMem_Malloc(2 * (size_t)n * sizeof(int64_t));
        long *ends = PyMem_Calloc((size_t)n, sizeof(long));
        Span *kept = PyMem_Malloc((nspans ? (size_t)nspans : 1) * sizeof(Span));
        Py_ssize_t nkept = 0;
        if (!first_end || !ends || !kept) PyErr_NoMemory();
        for (Py_ssize_t k = 0; window && iteration && first_end && ends && kept && k < nspans; k++) {
            if (spans[k].start < half || spans[k].end > now) continue;
            kept[nkept++] = spans[k];
            if (!train_first) {
                PyObject *t = span_tuple(&s, &spans[k]);
                if (!t || PyList_Append(window, t) < 0) {
                    Py_XDECREF(t);
                    Py_CLEAR(window);
                    break;
                }
                Py_DECREF(t);
            }
            if (spans[k].slot & 1) { /* a training end of member slot >> 1 */
                int i = spans[k].slot >> 1;
                if (ends[i]++ == 0) first_end[2 * i] = spans[k].end;
                first_end[2 * i + 1] = spans[k].end;
            }
        }
        if (window && iteration && first_end && ends && kept) {
            /* (e[-1] - e[0]) / (len(e) - 1) / TICKS_PER_S: both divisions correctly rounded,
             * as Python's, the difference exact in a double (times below 2^52) */
            for (int i = 0; i < n; i++)
                PyTuple_SET_ITEM(iteration, i, PyFloat_FromDouble(
                    ends[i] > 1 ? (double)(first_end[2 * i + 1] - first_end[2 * i]) / (double)(ends[i] - 1) / 1e6
                                : Py_HUGE_VAL));
            util = utilization(&s, kept, 0, nkept, period_ticks);
        }
        for (int i = 0; util && i < n; i++)
            if (!PyTuple_GET_ITEM(iteration, i)) Py_CLEAR(util);
        if (util && flush_pairs(pairs, met_pairs, n) == 0)
            result = Py_BuildValue("(idOOOL)", 2, (double)period_ticks / 1e6, iteration, util, window,
                                   (long long)half);
        Py_XDECREF(window);
        Py_XDECREF(iteration);
        Py_XDECREF(util);
        PyMem_Free(first_end);
        PyMem_Free(ends);
        PyMem_Free(kept);
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
    PyMem_Free(work);
    return result;
}

/* A set of uint64 values (stored plus one, so that 0 marks a free slot), for scan(). */
typedef struct {
    uint64_t *slots;
    size_t cap, used;
} U64Set;

static int u64set_add(U64Set *t, uint64_t v); /* 1 added, 0 present, -1 no memory */

static int u64set_has(const U64Set *t, uint64_t v) {
    if (!t->cap) return 0;
    size_t k = (size_t)((v + 1) * 0x9E3779B97F4A7C15ULL) & (t->cap - 1);
    for (; t->slots[k]; k = (k + 1) & (t->cap - 1))
        if (t->slots[k] == v + 1) return 1;
    return 0;
}

static int u64set_grow(U64Set *t) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    U64Set bigger = {PyMem_Calloc(cap, sizeof(uint64_t)), cap, 0};
    if (!bigger.slots) return -1;
    for (size_t k = 0; k < t->cap; k++)
        if (t->slots[k]) u64set_add(&bigger, t->slots[k] - 1);
    PyMem_Free(t->slots);
    *t = bigger;
    return 0;
}

static int u64set_add(U64Set *t, uint64_t v) {
    if (2 * (t->used + 1) > t->cap && u64set_grow(t) < 0) return -1;
    size_t k = (size_t)((v + 1) * 0x9E3779B97F4A7C15ULL) & (t->cap - 1);
    for (; t->slots[k]; k = (k + 1) & (t->cap - 1))
        if (t->slots[k] == v + 1) return 0;
    t->slots[k] = v + 1;
    t->used++;
    return 1;
}

/* Whether members at positions x and y of a part meet at instant 0 of start ``at`` (bit
 * x: x ready for training): in one queue, with a node in common in that pool. */
static int meet(const uint64_t (*nodes)[2], unsigned at, int x, int y) {
    int pool = at >> x & 1;
    return pool == (int)(at >> y & 1) && (nodes[x][pool] & nodes[y][pool]) != 0;
}

#define SCAN_MAX 10 /* members of a part: the start and the orientation of its meeting pairs in 64 bits */

/* scan(part, classes, rolls, trains, tie, caps, worst, run): kernel.worst_iterations'
 * search over every order of one part, as its Python loop does it, order for order
 * (itertools.permutations' order) and start for start. Positions 0..p-1 are the part's
 * members (part: their key indices, ascending). classes[x] numbers x's durations and
 * switch seconds (equal numbers: equal fields); rolls[x] and trains[x] are its node
 * indices (0..63) in the key. An order whose sub-key (kernel._part_key) an earlier order
 * had is skipped. Unless ``tie``, a start (at, the orientation of the pairs that meet at
 * instant 0) settled by an earlier run is skipped, and a run settles its start when
 * every pair whose order it consulted meets at instant 0. run(order, mask, collect)
 * (order: key indices) returns (iteration times by local index, the consulted pairs or
 * None). worst (floats by position) takes the maxima in place; caps (by position, or
 * None) stop the scan: returns True at the first run after which a member is above its
 * cap, else False. */
static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *part, *classes, *rolls, *trains, *caps, *worst, *run;
    int tie;
    if (!PyArg_ParseTuple(args, "O!O!O!O!pOO!O", &PyTuple_Type, &part, &PyTuple_Type, &classes, &PyTuple_Type,
                          &rolls, &PyTuple_Type, &trains, &tie, &caps, &PyList_Type, &worst, &run))
        return NULL;
    Py_ssize_t p = PyTuple_GET_SIZE(part);
    if (p < 2 || p > SCAN_MAX || PyTuple_GET_SIZE(classes) != p || PyTuple_GET_SIZE(rolls) != p ||
        PyTuple_GET_SIZE(trains) != p || PyList_GET_SIZE(worst) != p ||
        (caps != Py_None && (!PyTuple_Check(caps) || PyTuple_GET_SIZE(caps) != p))) {
        PyErr_SetString(PyExc_ValueError, "scan: a part of 2 to 10 members, every field by position");
        return NULL;
    }
    uint64_t nodes[SCAN_MAX][2];
    int cls[SCAN_MAX], perm[SCAN_MAX], rank[SCAN_MAX];
    unsigned char lists[SCAN_MAX][2][64];
    int lens[SCAN_MAX][2];
    double w[SCAN_MAX], cap[SCAN_MAX];
    for (int x = 0; x < p; x++) {
        cls[x] = (int)PyLong_AsLong(PyTuple_GET_ITEM(classes, x));
        w[x] = PyFloat_AsDouble(PyList_GET_ITEM(worst, x));
        cap[x] = caps == Py_None ? 0.0 : PyFloat_AsDouble(PyTuple_GET_ITEM(caps, x));
        if (PyErr_Occurred()) return NULL;
        for (int pool = 0; pool < 2; pool++) {
            PyObject *list = PyTuple_GET_ITEM(pool ? trains : rolls, x);
            if (!PyTuple_Check(list) || PyTuple_GET_SIZE(list) > 64) {
                PyErr_SetString(PyExc_ValueError, "scan: node indices 0..63 per member and pool");
                return NULL;
            }
            nodes[x][pool] = 0;
            lens[x][pool] = (int)PyTuple_GET_SIZE(list);
            for (int j = 0; j < lens[x][pool]; j++) {
                long v = PyLong_AsLong(PyTuple_GET_ITEM(list, j));
                if (v < 0 || v > 63) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "scan: node indices 0..63 per member and pool");
                    return NULL;
                }
                lists[x][pool][j] = (unsigned char)v;
                nodes[x][pool] |= 1ULL << v;
            }
        }
        perm[x] = x;
    }
    PyObject *seen = PySet_New(NULL), *order = NULL, *result = NULL;
    U64Set settled = {NULL, 0, 0};
    unsigned char code[SCAN_MAX * 132];
    if (!seen) return NULL;
    for (;;) {
        /* the order's sub-key, as a code: per member its class, then its nodes renamed by first use */
        signed char rename[64];
        memset(rename, -1, sizeof rename);
        int next_name = 0;
        Py_ssize_t len = 0;
        for (int local = 0; local < p; local++) {
            int x = perm[local];
            rank[x] = local;
            code[len++] = (unsigned char)cls[x];
            for (int pool = 0; pool < 2; pool++) {
                code[len++] = (unsigned char)lens[x][pool];
                for (int j = 0; j < lens[x][pool]; j++) {
                    int v = lists[x][pool][j];
                    if (rename[v] < 0) rename[v] = (signed char)next_name++;
                    code[len++] = (unsigned char)rename[v];
                }
            }
        }
        PyObject *sub = PyBytes_FromStringAndSize((const char *)code, len);
        int fresh = sub ? PySet_Contains(seen, sub) : -1;
        if (fresh == 0) fresh = PySet_Add(seen, sub) < 0 ? -1 : 1;
        Py_XDECREF(sub);
        if (fresh < 0) goto done;
        if (fresh) {
            Py_CLEAR(order);
            for (unsigned mask = 0; mask < (1u << p); mask++) {
                unsigned at = 0;
                for (int local = 0; local < p; local++)
                    if (mask >> local & 1) at |= 1u << perm[local];
                uint64_t settles = at;
                if (!tie) {
                    int k = (int)p;
                    for (int x = 0; x < p; x++)
                        for (int y = x + 1; y < p; y++)
                            if (meet(nodes, at, x, y)) settles |= (uint64_t)(rank[x] < rank[y]) << k++;
                    if (u64set_has(&settled, settles)) continue;
                }
                if (!order) {
                    order = PyTuple_New(p);
                    if (!order) goto done;
                    for (int local = 0; local < p; local++) {
                        PyObject *i = PyTuple_GET_ITEM(part, perm[local]);
                        Py_INCREF(i);
                        PyTuple_SET_ITEM(order, local, i);
                    }
                }
                PyObject *out = PyObject_CallFunction(run, "OIO", order, mask, tie ? Py_False : Py_True);
                if (!out) goto done;
                PyObject *iteration, *pairs;
                if (!PyArg_ParseTuple(out, "O!O", &PyTuple_Type, &iteration, &pairs) ||
                    PyTuple_GET_SIZE(iteration) != p) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "scan: run must give p iteration times");
                    Py_DECREF(out);
                    goto done;
                }
                for (int local = 0; local < p; local++) {
                    double v = PyFloat_AsDouble(PyTuple_GET_ITEM(iteration, local));
                    if (v > w[perm[local]]) w[perm[local]] = v;
                }
                if (PyErr_Occurred()) {
                    Py_DECREF(out);
                    goto done;
                }
                int settling = !tie && pairs != Py_None;
                if (settling) { /* every consulted pair meets at instant 0 */
                    PyObject *it = PyObject_GetIter(pairs), *pair;
                    while (it && settling && (pair = PyIter_Next(it))) {
                        long a = -1, b = -1;
                        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
                            a = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
                            b = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
                        }
                        settling = a >= 0 && a < p && b >= 0 && b < p && meet(nodes, at, perm[a], perm[b]);
                        Py_DECREF(pair);
                    }
                    Py_XDECREF(it);
                    if (!it || PyErr_Occurred()) {
                        Py_DECREF(out);
                        goto done;
                    }
                }
                Py_DECREF(out);
                if (settling && u64set_add(&settled, settles) < 0) {
                    PyErr_NoMemory();
                    goto done;
                }
                int above = 0;
                for (int x = 0; caps != Py_None && x < p; x++) above |= w[x] > cap[x];
                if (above) {
                    result = Py_True;
                    goto done;
                }
            }
        }
        /* the next order (itertools.permutations' order of distinct positions) */
        int i = (int)p - 2;
        while (i >= 0 && perm[i] > perm[i + 1]) i--;
        if (i < 0) break;
        int j = (int)p - 1;
        while (perm[j] < perm[i]) j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = (int)p - 1; a < b; a++, b--) {
            t = perm[a];
            perm[a] = perm[b];
            perm[b] = t;
        }
    }
    result = Py_False;
done:
    if (result) {
        for (int x = 0; x < p; x++) {
            PyObject *v = PyFloat_FromDouble(w[x]);
            if (!v || PyList_SetItem(worst, x, v) < 0) {
                result = NULL;
                break;
            }
        }
    }
    Py_XINCREF(result);
    Py_XDECREF(order);
    Py_DECREF(seen);
    PyMem_Free(settled.slots);
    return result;
}

static PyMethodDef methods[] = {
    {"prepare", prepare, METH_VARARGS, "A key's set-up for simulate, or None (see the file's comment)."},
    {"simulate", simulate, METH_VARARGS, "rollmux.kernel._simulate's loop (see the file's comment)."},
    {"scan", scan, METH_VARARGS, "kernel.worst_iterations' search over every order of a part (see scan's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csim", "The execution rule's loop in C.", -1, methods};

PyMODINIT_FUNC PyInit__csim(void) { return PyModule_Create(&module); }
