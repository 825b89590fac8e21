/* MinHash signatures (see module.c). */
#include "native.h"

/* ---- MinHash signatures ---- */

#define MAX_PERM 1024
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* One text's signature: for each permutation p, the top 32 bits of the minimum over the shingle hashes h of
 * a[p] * h + b[p] (mod 2**64). Integer arithmetic: every instruction set gives the same bits. Inlined into
 * one function per instruction set, so that the compiler vectorizes the loop over permutations with the
 * 64-bit multiplies each one has (AVX-512DQ has them in one instruction). */
static ALWAYS_INLINE void
minhash_body(const uint64_t *values, Py_ssize_t n, const uint64_t *a, const uint64_t *b, Py_ssize_t perms,
             uint32_t *out)
{
    uint64_t minima[MAX_PERM];
    for (Py_ssize_t p = 0; p < perms; p++)
        minima[p] = UINT64_MAX;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t h = values[j];
        for (Py_ssize_t p = 0; p < perms; p++) {
            uint64_t x = a[p] * h + b[p];
            minima[p] = x < minima[p] ? x : minima[p];
        }
    }
    for (Py_ssize_t p = 0; p < perms; p++)
        out[p] = (uint32_t)(minima[p] >> 32);
}

typedef void (*minhash_fn)(const uint64_t *, Py_ssize_t, const uint64_t *, const uint64_t *, Py_ssize_t, uint32_t *);

static void
minhash_base(const uint64_t *v, Py_ssize_t n, const uint64_t *a, const uint64_t *b, Py_ssize_t perms, uint32_t *out)
{
    minhash_body(v, n, a, b, perms, out);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define SIMDB_X86 1
__attribute__((target("avx2"))) static void
minhash_avx2(const uint64_t *v, Py_ssize_t n, const uint64_t *a, const uint64_t *b, Py_ssize_t perms, uint32_t *out)
{
    minhash_body(v, n, a, b, perms, out);
}

__attribute__((target("avx512f,avx512dq"))) static void
minhash_avx512(const uint64_t *v, Py_ssize_t n, const uint64_t *a, const uint64_t *b, Py_ssize_t perms, uint32_t *out)
{
    minhash_body(v, n, a, b, perms, out);
}
#endif

/* The kernel for an instruction set, and its name: 0 the best this CPU runs, 1 the baseline, 2 AVX2,
 * 3 AVX-512 (NULL where the CPU or the compiler lacks it). */
static minhash_fn
minhash_kernel(int isa, const char **name)
{
#ifdef SIMDB_X86
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    int avx2 = __builtin_cpu_supports("avx2");
    if (isa == 3 || (isa == 0 && avx512)) {
        *name = "avx512";
        return avx512 ? minhash_avx512 : NULL;
    }
    if (isa == 2 || (isa == 0 && avx2)) {
        *name = "avx2";
        return avx2 ? minhash_avx2 : NULL;
    }
#endif
    *name = "baseline";
    return isa == 0 || isa == 1 ? minhash_base : NULL;
}

/* minhashes(values, lengths, a, b, out, isa=0): values (uint64) are the shingle hashes of the texts end to
 * end, lengths (int64) how many each text has (at least one), a and b (uint64) the permutations, out
 * (uint32, texts x permutations, C order) the signatures. Returns the name of the instruction set used. */
static PyObject *
minhashes(PyObject *self, PyObject *args)
{
    PyObject *values_obj, *lengths_obj, *a_obj, *b_obj, *out_obj;
    int isa = 0;
    if (!PyArg_ParseTuple(args, "OOOOO|i:minhashes", &values_obj, &lengths_obj, &a_obj, &b_obj, &out_obj, &isa))
        return NULL;
    const char *name = NULL;
    minhash_fn kernel = minhash_kernel(isa, &name);
    if (kernel == NULL)
        return PyErr_Format(PyExc_ValueError, "minhashes: instruction set %d is not available here", isa);
    Py_buffer values = {0}, lengths = {0}, a = {0}, b = {0}, out = {0};
    PyObject *result = NULL;
    if (simdb_get_buffer(values_obj, &values, 8, 0, "minhashes' values") < 0 ||
        simdb_get_buffer(lengths_obj, &lengths, 8, 0, "minhashes' lengths") < 0 ||
        simdb_get_buffer(a_obj, &a, 8, 0, "minhashes' a") < 0 || simdb_get_buffer(b_obj, &b, 8, 0, "minhashes' b") < 0 ||
        simdb_get_buffer(out_obj, &out, 4, 1, "minhashes' output") < 0)
        goto done;
    Py_ssize_t texts = lengths.len / 8, perms = a.len / 8, total = values.len / 8, start = 0;
    if (b.len != a.len || perms < 1 || perms > MAX_PERM) {
        PyErr_Format(PyExc_ValueError, "minhashes: a and b must hold the same 1 to %d permutations", MAX_PERM);
        goto done;
    }
    if (out.len / 4 != texts * perms) {
        PyErr_SetString(PyExc_ValueError, "minhashes: the output must hold texts x permutations values");
        goto done;
    }
    const int64_t *count = lengths.buf;
    for (Py_ssize_t t = 0; t < texts; t++) {
        if (count[t] < 1 || count[t] > total - start) {
            PyErr_SetString(PyExc_ValueError, "minhashes: every text needs at least one shingle, and the "
                                              "lengths must add up to the values");
            goto done;
        }
        start += count[t];
    }
    if (start != total) {
        PyErr_SetString(PyExc_ValueError, "minhashes: the lengths must add up to the values");
        goto done;
    }
    const uint64_t *v = values.buf;
    uint32_t *target = out.buf;
    Py_BEGIN_ALLOW_THREADS
    start = 0;
    for (Py_ssize_t t = 0; t < texts; t++) {
        kernel(v + start, count[t], a.buf, b.buf, perms, target + t * perms);
        start += count[t];
    }
    Py_END_ALLOW_THREADS
    result = PyUnicode_FromString(name);
done:
    if (values.obj) PyBuffer_Release(&values);
    if (lengths.obj) PyBuffer_Release(&lengths);
    if (a.obj) PyBuffer_Release(&a);
    if (b.obj) PyBuffer_Release(&b);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

PyMethodDef simdb_minhash_methods[] = {
    {"minhashes", minhashes, METH_VARARGS,
     "minhashes(values, lengths, a, b, out, isa=0) -> the instruction set used (MinHash signatures)."},
    {NULL, NULL, 0, NULL},
};
