/* The Maglev fill loop (ebpflb.maglev.fill.fill_many), compiled when the package is
 * installed (pyproject.toml's ext-modules): no JIT, no LLVM in the agent.
 *
 * Pseudocode 1 of Eisenbud et al. (NSDI 2016) with Katran's weighted turns, for many
 * tables in one call: table s owns backends [backend_starts[s], backend_starts[s+1]) of
 * offsets/skips/weights and slots [slot_starts[s], slot_starts[s+1]) of out. pos[i] is
 * permutation[i][next[i]], advanced by skip rather than recomputed with a multiplication.
 * tests/unit/maglev/maglev_reference.py is the paper's loop, literally; the tests check this one
 * against it.
 *
 * Every input is checked before the loop (a bad one raises ValueError, never reads or
 * writes outside the buffers or loops forever); the loop itself runs without the GIL, so
 * the agent's other threads (watches, HTTP) go on during a large build.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Keeps the exported buffers of one call, released together. */
struct buffers {
    Py_buffer offsets, skips, weights, backend_starts, out, slot_starts;
    int held;
};

static void release(struct buffers *b)
{
    Py_buffer *all[] = {&b->offsets, &b->skips, &b->weights,
                        &b->backend_starts, &b->out, &b->slot_starts};
    for (int i = 0; i < b->held; i++)
        PyBuffer_Release(all[i]);
}

/* A C-contiguous 1-d buffer of integers of `itemsize` bytes (numpy's int64 is 'l' or 'q'). */
static int get(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable,
               const char *name, struct buffers *b)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0)
        return -1;
    b->held++;
    const char *f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    int integer = f[0] != '\0' && f[1] == '\0' && strchr("bBhHiIlLqQ", f[0]) != NULL;
    if (view->ndim != 1 || view->itemsize != itemsize || !integer || strchr("BHILQ", f[0])) {
        PyErr_Format(PyExc_ValueError, "%s must be a 1-d array of int%zd", name, itemsize * 8);
        return -1;
    }
    return 0;
}

/* Checks what the loop relies on: bounds within the buffers, 0 <= offset < M and
 * 1 <= skip < M (M > 1 for a table with backends), weights in [0, 2^32). A prime M (the
 * caller's check) then makes every permutation visit every slot, so each probe ends; for
 * any other M, fill() gives up after M probes. */
static int check(const int64_t *offsets, const int64_t *skips, const int64_t *weights,
                 Py_ssize_t n_backends, const int64_t *bstarts, const int64_t *sstarts,
                 Py_ssize_t n_tables, Py_ssize_t n_slots, Py_ssize_t *widest)
{
    *widest = 0;
    if (n_tables == 0)
        return 0;
    if (bstarts[0] != 0 || sstarts[0] != 0 || bstarts[n_tables] != n_backends ||
        sstarts[n_tables] != n_slots) {
        PyErr_SetString(PyExc_ValueError, "table bounds do not cover the arrays");
        return -1;
    }
    /* The bounds first: with them in order, every table lies inside the arrays. */
    for (Py_ssize_t s = 0; s < n_tables; s++) {
        if (bstarts[s + 1] < bstarts[s] || sstarts[s + 1] < sstarts[s]) {
            PyErr_Format(PyExc_ValueError, "table %zd: bounds decrease", s);
            return -1;
        }
        if (bstarts[s + 1] - bstarts[s] > *widest)
            *widest = (Py_ssize_t)(bstarts[s + 1] - bstarts[s]);
    }
    for (Py_ssize_t s = 0; s < n_tables; s++) {
        int64_t size = sstarts[s + 1] - sstarts[s];
        for (int64_t i = bstarts[s]; i < bstarts[s + 1]; i++) {
            if (weights[i] < 0 || weights[i] > (int64_t)UINT32_MAX) {
                PyErr_Format(PyExc_ValueError, "table %zd: weight %lld outside [0, 2^32)", s,
                             (long long)weights[i]);
                return -1;
            }
            if (size < 2 || offsets[i] < 0 || offsets[i] >= size || skips[i] < 1 ||
                skips[i] >= size) {
                PyErr_Format(PyExc_ValueError,
                             "table %zd: offset %lld / skip %lld do not fit %lld slots", s,
                             (long long)offsets[i], (long long)skips[i], (long long)size);
                return -1;
            }
        }
    }
    return 0;
}

/* One table; pos and cum have room for its n backends. Returns -1 if a probe went all
 * the way round its permutation (M not prime: the caller's error), else 0. */
static int fill(const int64_t *offsets, const int64_t *skips, const int64_t *weights,
                int64_t n, int32_t *out, int64_t size, int64_t *pos, int64_t *cum)
{
    int64_t max_weight = 0, min_weight = INT64_MAX;
    for (int64_t i = 0; i < size; i++)
        out[i] = -1;
    for (int64_t i = 0; i < n; i++) {
        if (weights[i] > max_weight)
            max_weight = weights[i];
        if (weights[i] < min_weight)
            min_weight = weights[i];
        pos[i] = offsets[i];
        cum[i] = 0;
    }
    if (max_weight == 0)
        return 0;
    /* Equal weights (almost every service): every backend takes every turn. */
    int equal = min_weight == max_weight;
    int64_t filled = 0;
    for (;;) {
        for (int64_t i = 0; i < n; i++) {
            if (!equal) {
                int64_t turn = cum[i] + weights[i];
                if (turn < max_weight) {
                    cum[i] = turn;
                    continue;
                }
                cum[i] = turn - max_weight;
            }
            int64_t c = pos[i], skip = skips[i], probes = 0;
            while (out[c] >= 0) {
                c += skip;
                if (c >= size)
                    c -= size;
                if (++probes == size)
                    return -1;
            }
            out[c] = (int32_t)i;
            c += skip;
            if (c >= size)
                c -= size;
            pos[i] = c;
            if (++filled == size)
                return 0;
        }
    }
}

static PyObject *fill_many(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *objs[6];
    if (!PyArg_ParseTuple(args, "OOOOOO:fill_many", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5]))
        return NULL;
    struct buffers b = {.held = 0};
    if (get(objs[0], &b.offsets, 8, 0, "offsets", &b) < 0 ||
        get(objs[1], &b.skips, 8, 0, "skips", &b) < 0 ||
        get(objs[2], &b.weights, 8, 0, "weights", &b) < 0 ||
        get(objs[3], &b.backend_starts, 8, 0, "backend_starts", &b) < 0 ||
        get(objs[4], &b.out, 4, 1, "out", &b) < 0 ||
        get(objs[5], &b.slot_starts, 8, 0, "slot_starts", &b) < 0)
        goto fail;
    Py_ssize_t n_backends = b.offsets.shape[0];
    if (b.skips.shape[0] != n_backends || b.weights.shape[0] != n_backends) {
        PyErr_SetString(PyExc_ValueError, "offsets, skips and weights differ in length");
        goto fail;
    }
    Py_ssize_t n_bounds = b.backend_starts.shape[0];
    if (n_bounds == 0 || b.slot_starts.shape[0] != n_bounds) {
        PyErr_SetString(PyExc_ValueError, "backend_starts and slot_starts need one bound per"
                                          " table and one more, the same number");
        goto fail;
    }
    const int64_t *offsets = b.offsets.buf, *skips = b.skips.buf, *weights = b.weights.buf;
    const int64_t *bstarts = b.backend_starts.buf, *sstarts = b.slot_starts.buf;
    int32_t *out = b.out.buf;
    Py_ssize_t n_tables = n_bounds - 1, widest;
    if (check(offsets, skips, weights, n_backends, bstarts, sstarts, n_tables,
              b.out.shape[0], &widest) < 0)
        goto fail;
    int64_t *scratch = PyMem_RawMalloc(sizeof(int64_t) * 2 * (size_t)(widest ? widest : 1));
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t stuck = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t s = 0; s < n_tables && stuck < 0; s++) {
        int64_t b0 = bstarts[s];
        if (fill(offsets + b0, skips + b0, weights + b0, bstarts[s + 1] - b0, out + sstarts[s],
                 sstarts[s + 1] - sstarts[s], scratch, scratch + widest) < 0)
            stuck = s;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(scratch);
    if (stuck >= 0) {
        PyErr_Format(PyExc_ValueError, "table %zd: a permutation misses free slots (size not"
                                       " prime)", stuck);
        goto fail;
    }
    release(&b);
    Py_RETURN_NONE;
fail:
    release(&b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"fill_many", fill_many, METH_VARARGS,
     "fill_many(offsets, skips, weights, backend_starts, out, slot_starts): fill `out`\n"
     "(int32) with each table's backend indices (-1: no backend with weight), table s\n"
     "from backends [backend_starts[s], backend_starts[s+1]) (int64 arrays) into slots\n"
     "[slot_starts[s], slot_starts[s+1])."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ebpflb.maglev.fill",
    .m_doc = "The Maglev fill loop in C (see ebpflb.maglev).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit_fill(void)
{
    return PyModule_Create(&module);
}
