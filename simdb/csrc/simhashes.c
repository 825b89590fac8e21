/* Token ids and SimHash sums (see module.c). */
#include "native.h"

/* ---- token ids ---- */

/* Writes each token's id (a value of ``ids``, or -1 where it has none) into ``out`` (int64, one per token,
 * text after text); returns the tokens that had none, in order (a token once per occurrence). */
static PyObject *
token_ids(PyObject *self, PyObject *args)
{
    PyObject *lists, *ids, *out;
    if (!PyArg_ParseTuple(args, "O!O!O:token_ids", &PyList_Type, &lists, &PyDict_Type, &ids, &out))
        return NULL;
    Py_buffer view;
    if (simdb_get_buffer(out, &view, 8, 1, "token_ids' output") < 0)
        return NULL;
    int64_t *target = view.buf;
    Py_ssize_t capacity = view.len / 8, written = 0;
    PyObject *missing = PyList_New(0);
    if (missing == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(lists); t++) {
        PyObject *tokens = PyList_GET_ITEM(lists, t);
        if (!PyList_Check(tokens)) {
            PyErr_SetString(PyExc_TypeError, "token_ids() takes a list of lists of tokens");
            goto error;
        }
        Py_ssize_t count = PyList_GET_SIZE(tokens);
        if (written + count > capacity) {
            PyErr_SetString(PyExc_ValueError, "token_ids' output is shorter than the tokens");
            goto error;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *id = PyDict_GetItemWithError(ids, PyList_GET_ITEM(tokens, i));
            if (id == NULL) {
                if (PyErr_Occurred())
                    goto error;
                target[written++] = -1;
                if (PyList_Append(missing, PyList_GET_ITEM(tokens, i)) < 0)
                    goto error;
            } else {
                long long value = PyLong_AsLongLong(id);
                if (value == -1 && PyErr_Occurred())
                    goto error;
                target[written++] = value;
            }
        }
    }
    if (written != capacity) {
        PyErr_SetString(PyExc_ValueError, "token_ids' output is longer than the tokens");
        goto error;
    }
    PyBuffer_Release(&view);
    return missing;
error:
    Py_DECREF(missing);
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- simhashes ---- */

/* kinds of vocabulary entries, as in simdb.methods.simhash.fingerprint */
#define WORD 0
#define SPACE 2

/* weightings */
#define W_TF 0
#define W_SUBLINEAR 1
#define W_BINARY 2

typedef struct {
    uint64_t key;
    int64_t count;
} Slot;

#define EMPTY_KEY UINT64_MAX

/* An open-addressing count table; capacity a power of two, at least twice the keys it holds. It starts small
 * and doubles as keys arrive, so that it holds what a text has distinct, not one slot per token: a text of
 * 25M tokens sized two tables by its tokens (4 GB) where its distinct tokens and bigrams take a fraction. */
typedef struct {
    Slot *slots;
    size_t capacity;
    size_t *used; /* indexes of the occupied slots, in the order they were filled */
    size_t n_used, used_room;
} Counts;

/* Keys a table starts with room for; it grows from there. */
#define INITIAL_KEYS 4096

/* Makes room for ``keys`` keys (``malloc`` alone: callable without the GIL); -1 when memory ran out. */
static int
counts_reserve(Counts *c, size_t keys)
{
    size_t capacity = 16;
    while (capacity < 2 * keys)
        capacity <<= 1;
    c->slots = malloc(capacity * sizeof(Slot));
    c->used = malloc(keys * sizeof(size_t));
    if (c->slots == NULL || c->used == NULL)
        return -1;
    c->capacity = capacity;
    c->n_used = 0;
    c->used_room = keys;
    for (size_t i = 0; i < capacity; i++)
        c->slots[i].key = EMPTY_KEY;
    return 0;
}

/* Empties the table, slot by slot of those filled. */
static void
counts_clear(Counts *c)
{
    for (size_t i = 0; i < c->n_used; i++)
        c->slots[c->used[i]].key = EMPTY_KEY;
    c->n_used = 0;
}

static inline uint64_t
mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Twice the capacity, every key moved (the order of ``used`` kept); -1 when memory ran out. */
static int
counts_grow(Counts *c)
{
    size_t capacity = c->capacity * 2, mask = capacity - 1, room = c->used_room * 2;
    Slot *slots = malloc(capacity * sizeof(Slot));
    size_t *used = realloc(c->used, room * sizeof(size_t));
    if (used != NULL) {
        c->used = used;
        c->used_room = room;
    }
    if (slots == NULL || used == NULL) {
        free(slots);
        return -1;
    }
    for (size_t i = 0; i < capacity; i++)
        slots[i].key = EMPTY_KEY;
    for (size_t u = 0; u < c->n_used; u++) {
        Slot *old = &c->slots[c->used[u]];
        size_t i = mix(old->key) & mask;
        while (slots[i].key != EMPTY_KEY)
            i = (i + 1) & mask;
        slots[i] = *old;
        c->used[u] = i;
    }
    free(c->slots);
    c->slots = slots;
    c->capacity = capacity;
    return 0;
}

/* Counts one more ``key``; -1 when the table had to grow and memory ran out. */
static inline int
counts_add(Counts *c, uint64_t key)
{
    size_t mask = c->capacity - 1, i = mix(key) & mask;
    while (c->slots[i].key != EMPTY_KEY) {
        if (c->slots[i].key == key) {
            c->slots[i].count++;
            return 0;
        }
        i = (i + 1) & mask;
    }
    if (2 * (c->n_used + 1) > c->capacity || c->n_used == c->used_room) {
        if (counts_grow(c) < 0)
            return -1;
        return counts_add(c, key);
    }
    c->slots[i].key = key;
    c->slots[i].count = 1;
    c->used[c->n_used++] = i;
    return 0;
}

/* ``*array`` with room for at least ``n`` doubles or uint64s (8 bytes each), grown by doubling; -1 when
 * memory ran out. */
static int
ensure_room(void **array, size_t *room, size_t n)
{
    if (n <= *room)
        return 0;
    size_t grown = *room ? *room : 1024;
    while (grown < n)
        grown *= 2;
    void *bigger = realloc(*array, grown * 8);
    if (bigger == NULL)
        return -1;
    *array = bigger;
    *room = grown;
    return 0;
}

/* Below this many features a text's sums are taken feature by feature (64 multiply-adds each), above it
 * through byte bins (8 additions each, then 2,048 multiply-adds a text). */
#define FEW_FEATURES 256

/* Row v, column b: +1.0 where bit b of the byte v is set, else -1.0 (filled when the module loads). */
static double byte_signs[256][8];

/* simdb.methods.simhash.fingerprint.bigram_hashes, for one pair */
static inline uint64_t
bigram_hash(uint64_t first, uint64_t second)
{
    return mix(((first << 32) | (first >> 32)) ^ second);
}

/* Whether the exact sum of ``terms`` is positive (Shewchuk's partials, as math.fsum keeps them: nonoverlapping,
 * in increasing magnitude, so the sign of the sum is that of the largest nonzero one). */
static int
exact_sum_positive(const double *terms, size_t n, double *partials)
{
    size_t used = 0;
    for (size_t t = 0; t < n; t++) {
        double x = terms[t];
        size_t i = 0;
        for (size_t k = 0; k < used; k++) {
            double y = partials[k];
            if (fabs(x) < fabs(y)) {
                double swap = x;
                x = y;
                y = swap;
            }
            double hi = x + y;
            double lo = y - (hi - x);
            if (lo != 0.0)
                partials[i++] = lo;
            x = hi;
        }
        partials[i] = x;
        used = i + 1;
    }
    for (size_t k = used; k-- > 0;)
        if (partials[k] != 0.0)
            return partials[k] > 0.0;
    return 0;
}

static inline double
term_weight(int64_t frequency, int weighting, const double *sublinear, Py_ssize_t sublinear_size)
{
    switch (weighting) {
    case W_BINARY:
        return 1.0;
    case W_SUBLINEAR:
        return frequency < sublinear_size ? sublinear[frequency] : 1.0 + log((double)frequency);
    default:
        return (double)frequency;
    }
}

/* simhashes(ids, lengths, hashes, kinds, sublinear, out, weighting, bigrams, stopwords)
 *
 * ids: int64, each text's tokens' vocabulary ids, text after text; lengths: int64, tokens per text;
 * hashes: uint64 and kinds: int8 per vocabulary id; sublinear: float64, 1 + ln(tf) for small tf;
 * out: uint64, one fingerprint per text. What simdb.methods.simhash.fingerprint.simhashes_of_tokens computes
 * with numpy, and the same value: the signs of the sums do not depend on the order of summation (a sum
 * within its worst-case rounding error of zero is decided exactly). */
static PyObject *
simhashes(PyObject *self, PyObject *args)
{
    PyObject *ids_obj, *lengths_obj, *hashes_obj, *kinds_obj, *sublinear_obj, *out_obj;
    int weighting, stopwords;
    long long bigrams;
    if (!PyArg_ParseTuple(args, "OOOOOOiLp:simhashes", &ids_obj, &lengths_obj, &hashes_obj, &kinds_obj,
                          &sublinear_obj, &out_obj, &weighting, &bigrams, &stopwords))
        return NULL;
    if (weighting != W_TF && weighting != W_SUBLINEAR && weighting != W_BINARY) {
        PyErr_SetString(PyExc_ValueError, "simhashes: unknown weighting");
        return NULL;
    }
    Py_buffer ids_view = {0}, lengths_view = {0}, hashes_view = {0}, kinds_view = {0}, sublinear_view = {0},
              out_view = {0};
    PyObject *result = NULL;
    uint64_t *feature_hashes = NULL;
    double *feature_weights = NULL, *terms = NULL, *partials = NULL;
    Counts tokens = {0}, pairs = {0};
    if (simdb_get_buffer(ids_obj, &ids_view, 8, 0, "ids") < 0 || simdb_get_buffer(lengths_obj, &lengths_view, 8, 0, "lengths") < 0
        || simdb_get_buffer(hashes_obj, &hashes_view, 8, 0, "hashes") < 0 || simdb_get_buffer(kinds_obj, &kinds_view, 1, 0, "kinds") < 0
        || simdb_get_buffer(sublinear_obj, &sublinear_view, 8, 0, "sublinear") < 0
        || simdb_get_buffer(out_obj, &out_view, 8, 1, "out") < 0)
        goto done;
    const int64_t *ids = ids_view.buf, *lengths = lengths_view.buf;
    const uint64_t *hashes = hashes_view.buf;
    const signed char *kinds = kinds_view.buf;
    const double *sublinear = sublinear_view.buf;
    uint64_t *out = out_view.buf;
    Py_ssize_t texts = lengths_view.len / 8, vocabulary = hashes_view.len / 8, total = ids_view.len / 8;
    Py_ssize_t sublinear_size = sublinear_view.len / 8;
    if (out_view.len / 8 != texts || kinds_view.len != vocabulary) {
        PyErr_SetString(PyExc_ValueError, "simhashes: one fingerprint per text, one kind per hash");
        goto done;
    }
    Py_ssize_t longest = 0, sum = 0;
    for (Py_ssize_t t = 0; t < texts; t++) {
        if (lengths[t] < 0) {
            PyErr_SetString(PyExc_ValueError, "simhashes: a negative length");
            goto done;
        }
        if (lengths[t] > longest)
            longest = lengths[t];
        sum += lengths[t];
    }
    if (sum != total) {
        PyErr_SetString(PyExc_ValueError, "simhashes: the lengths do not add up to the ids");
        goto done;
    }
    for (Py_ssize_t i = 0; i < total; i++)
        if (ids[i] < 0 || ids[i] >= vocabulary || ids[i] > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "simhashes: a token id outside the vocabulary");
            goto done;
        }
    /* the tables and the feature arrays grow with what a text has distinct: their size follows its
     * distinct tokens and bigrams, never a copy per token (a text of 25M tokens took 4 GB) */
    size_t start_keys = longest < INITIAL_KEYS ? (size_t)longest + 1 : INITIAL_KEYS;
    size_t hashes_room = 0, weights_room = 0, terms_room = 0, partials_room = 0;
    int out_of_memory = 0;
    if (counts_reserve(&tokens, start_keys) < 0 || counts_reserve(&pairs, start_keys) < 0) {
        PyErr_NoMemory();
        goto done;
    }

    Py_BEGIN_ALLOW_THREADS
    const int64_t *text_ids = ids;
    for (Py_ssize_t t = 0; t < texts && !out_of_memory; t++) {
        Py_ssize_t count = lengths[t], n = 0;
        /* stop words and the spaces between Han runs dropped; a text of nothing but stop words keeps them */
        int keep_stopwords = !stopwords;
        if (stopwords) {
            keep_stopwords = 1;
            for (Py_ssize_t i = 0; i < count; i++)
                if (kinds[text_ids[i]] == WORD) {
                    keep_stopwords = 0;
                    break;
                }
        }
        counts_clear(&tokens);
        counts_clear(&pairs);
        int64_t previous = -1;
        for (Py_ssize_t i = 0; i < count && !out_of_memory; i++) {
            int64_t id = text_ids[i];
            signed char kind = kinds[id];
            if (keep_stopwords ? kind == SPACE : kind != WORD)
                continue;
            n++;
            if (counts_add(&tokens, (uint64_t)id) < 0
                || (previous >= 0 && counts_add(&pairs, ((uint64_t)previous << 32) | (uint64_t)id) < 0))
                out_of_memory = 1;
            previous = id;
        }
        text_ids += count;
        if (out_of_memory || ensure_room((void **)&feature_hashes, &hashes_room, tokens.n_used + pairs.n_used) < 0
            || ensure_room((void **)&feature_weights, &weights_room, tokens.n_used + pairs.n_used) < 0) {
            out_of_memory = 1;
            break;
        }

        size_t features = 0;
        for (size_t u = 0; u < tokens.n_used; u++) {
            Slot *s = &tokens.slots[tokens.used[u]];
            feature_hashes[features] = hashes[s->key];
            feature_weights[features++] = term_weight(s->count, weighting, sublinear, sublinear_size);
        }
        if (n > 1) {
            double scale = (double)bigrams / (double)n;
            if (scale > 1.0)
                scale = 1.0;
            for (size_t u = 0; u < pairs.n_used; u++) {
                Slot *s = &pairs.slots[pairs.used[u]];
                feature_hashes[features] = bigram_hash(hashes[s->key >> 32], hashes[s->key & 0xFFFFFFFFULL]);
                feature_weights[features++] = term_weight(s->count, weighting, sublinear, sublinear_size) * scale;
            }
        }

        /* each bit's signed sum: for a few features, feature by feature; for more, the weights binned by each
         * byte of their hashes first (8 additions a feature), then each bit's sum from its byte's 256 bins */
        double totals[64] = {0}, magnitude = 0.0;
        if (features <= FEW_FEATURES) {
            for (size_t f = 0; f < features; f++) {
                uint64_t h = feature_hashes[f];
                double w = feature_weights[f];
                magnitude += fabs(w);
                for (int byte = 0; byte < 8; byte++) {
                    const double *signs = byte_signs[(h >> (8 * byte)) & 0xFF];
                    for (int bit = 0; bit < 8; bit++)  /* w * +-1 is exact: the sums are of the weights alone */
                        totals[8 * byte + bit] += w * signs[bit];
                }
            }
        } else {
            double bins[8][256];
            memset(bins, 0, sizeof bins);
            for (size_t f = 0; f < features; f++) {
                uint64_t h = feature_hashes[f];
                double w = feature_weights[f];
                magnitude += fabs(w);
                for (int byte = 0; byte < 8; byte++)
                    bins[byte][(h >> (8 * byte)) & 0xFF] += w;
            }
            for (int byte = 0; byte < 8; byte++) {
                double *sums = totals + 8 * byte;
                for (int v = 0; v < 256; v++) {
                    double w = bins[byte][v];
                    for (int bit = 0; bit < 8; bit++)
                        sums[bit] += w * byte_signs[v][bit];
                }
            }
        }
        /* the bound of simdb.methods.simhash.fingerprint._simhashes: far above this order's error */
        double bound = (2.0 * (double)features + 2.0) * ldexp(1.0, -52) * magnitude;
        uint64_t fingerprint = 0;
        for (int bit = 0; bit < 64; bit++) {
            int positive;
            if (fabs(totals[bit]) <= bound) {
                if (ensure_room((void **)&terms, &terms_room, features) < 0
                    || ensure_room((void **)&partials, &partials_room, features + 1) < 0) {
                    out_of_memory = 1;
                    break;
                }
                for (size_t f = 0; f < features; f++)
                    terms[f] = (feature_hashes[f] >> bit) & 1 ? feature_weights[f] : -feature_weights[f];
                positive = exact_sum_positive(terms, features, partials);
            } else {
                positive = totals[bit] > 0.0;
            }
            if (positive)
                fingerprint |= (uint64_t)1 << bit;
        }
        out[t] = fingerprint;
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);

done:
    free(feature_hashes);
    free(feature_weights);
    free(terms);
    free(partials);
    free(tokens.slots);
    free(tokens.used);
    free(pairs.slots);
    free(pairs.used);
    if (ids_view.obj) PyBuffer_Release(&ids_view);
    if (lengths_view.obj) PyBuffer_Release(&lengths_view);
    if (hashes_view.obj) PyBuffer_Release(&hashes_view);
    if (kinds_view.obj) PyBuffer_Release(&kinds_view);
    if (sublinear_view.obj) PyBuffer_Release(&sublinear_view);
    if (out_view.obj) PyBuffer_Release(&out_view);
    return result;
}

void
simdb_simhash_init(void)
{
    for (int v = 0; v < 256; v++)
        for (int bit = 0; bit < 8; bit++)
            byte_signs[v][bit] = (v >> bit) & 1 ? 1.0 : -1.0;
}

PyMethodDef simdb_simhash_methods[] = {
    {"token_ids", token_ids, METH_VARARGS, "token_ids(lists, ids, out) -> the tokens without an id."},
    {"simhashes", simhashes, METH_VARARGS,
     "simhashes(ids, lengths, hashes, kinds, sublinear, out, weighting, bigrams, stopwords)."},
    {NULL, NULL, 0, NULL},
};
