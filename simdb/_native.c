/* simdb's compiled fast paths: the per-character and per-token loops of a SimHash fingerprint.
 *
 * Each function does exactly what a pure-Python function of simdb does, only without the interpreter in
 * the loop, and each gives up (returns None) where a text needs what it does not handle; the caller then
 * takes the Python path. The tests hold every function to its Python twin (simdb/native.py names them).
 *
 *   fold(text)                   simdb.text.normalize.fold, for text of the Basic Multilingual Plane whose
 *                                characters need no composing: one table lookup per character
 *   has_astral(text)             whether a text holds a character beyond the BMP, without reading it
 *   any_marked(text, marks)      whether a text holds a character of a bit set over the BMP, or one beyond
 *                                it (simdb.text.t2s.may_change: whether OpenCC's t2s may change it)
 *   runs(folded)                 the Han text, the words and the runs of the other scripts without spaces
 *                                that the auto tokenizer reads out of folded text with three regexes
 *   auto_runs(texts, marks)      fold, the t2s check and runs for a whole batch of texts in one call
 *   token_ids(lists, ids, out)   the vocabulary's id of every token (-1 for a new one), and the new ones
 *   simhashes(...)               the SimHash of each text from its token ids: stop words dropped, tokens and
 *                                bigrams counted and weighted, signed sums by byte bins, exact signs near 0
 *   minhashes(...)               MinHash signatures of many texts' shingle hashes (simdb.methods.minhash.
 *                                signature.signatures): the minimum of a * h + b per permutation, on AVX-512
 *                                or AVX2 where the CPU has them
 *
 * The tables (which character folds to what, which class each character is in) are built in Python from
 * the definitions simdb's regexes and unicodedata give, and handed over once by set_tables().
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- tables (set once per process by set_tables) ---- */

#define BMP 65536

/* fold: per BMP character, the string it folds to (casefold of its NFKC form), or NULL when it stays itself;
 * and whether it may need composing with its neighbours (then the whole text takes the Python path). */
static PyObject *fold_to[BMP];
static unsigned char fold_unsafe[BMP];

/* runs: per BMP character, a set of class bits. */
#define C_HAN 1      /* a Han character: kept in the Han text */
#define C_NOSPACE 2  /* one of the other scripts without spaces, not punctuation: shingled */
#define C_WORD 4     /* part of a word */
#define C_DIFFERS 8  /* a Han character jieba-rs and jieba segment differently (simdb.text.segment) */
static unsigned char char_class[BMP];

static int tables_set = 0;

static PyObject *
set_tables(PyObject *self, PyObject *args)
{
    PyObject *folds, *unsafe, *classes;
    if (!PyArg_ParseTuple(args, "O!SS:set_tables", &PyDict_Type, &folds, &unsafe, &classes))
        return NULL;
    if (PyBytes_GET_SIZE(unsafe) != BMP || PyBytes_GET_SIZE(classes) != BMP) {
        PyErr_SetString(PyExc_ValueError, "the character tables must have 65536 entries");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < BMP; i++)
        Py_CLEAR(fold_to[i]);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(folds, &pos, &key, &value)) {
        long cp = PyLong_AsLong(key);
        if (cp == -1 && PyErr_Occurred())
            return NULL;
        if (cp < 0 || cp >= BMP || !PyUnicode_Check(value)) {
            PyErr_SetString(PyExc_ValueError, "fold table: a code point of the BMP -> a string");
            return NULL;
        }
        Py_INCREF(value);
        fold_to[cp] = value;
    }
    memcpy(fold_unsafe, PyBytes_AS_STRING(unsafe), BMP);
    memcpy(char_class, PyBytes_AS_STRING(classes), BMP);
    tables_set = 1;
    Py_RETURN_NONE;
}

static int
check_tables(void)
{
    if (!tables_set) {
        PyErr_SetString(PyExc_RuntimeError, "simdb._native: set_tables() was not called");
        return 0;
    }
    return 1;
}

/* ---- fold ---- */

static PyObject *
fold(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "fold() takes a str");
        return NULL;
    }
    if (!check_tables())
        return NULL;
    int kind = PyUnicode_KIND(text);
    if (kind == PyUnicode_4BYTE_KIND)  /* a character beyond the BMP: the Python path */
        Py_RETURN_NONE;
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), length = 0;
    Py_UCS4 maxchar = 0;
    int changed = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (fold_unsafe[c])
            Py_RETURN_NONE;
        PyObject *to = fold_to[c];
        if (to == NULL) {
            length += 1;
            if (c > maxchar)
                maxchar = c;
        } else {
            changed = 1;
            length += PyUnicode_GET_LENGTH(to);
            Py_UCS4 m = PyUnicode_MAX_CHAR_VALUE(to);
            if (m > maxchar)
                maxchar = m;
        }
    }
    if (!changed)
        return Py_NewRef(text);
    PyObject *out = PyUnicode_New(length, maxchar);
    if (out == NULL)
        return NULL;
    int out_kind = PyUnicode_KIND(out);
    void *out_data = PyUnicode_DATA(out);
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        PyObject *to = fold_to[c];
        if (to == NULL) {
            PyUnicode_WRITE(out_kind, out_data, j++, c);
        } else {
            int to_kind = PyUnicode_KIND(to);
            const void *to_data = PyUnicode_DATA(to);
            for (Py_ssize_t k = 0; k < PyUnicode_GET_LENGTH(to); k++)
                PyUnicode_WRITE(out_kind, out_data, j++, PyUnicode_READ(to_kind, to_data, k));
        }
    }
    return out;
}

/* ---- astral ---- */

/* Whether a str holds a character beyond the BMP: CPython stores a str in the narrowest of its three
 * widths, so exactly the strs of the widest one do (no scan). */
static PyObject *
has_astral(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "has_astral() takes a str");
        return NULL;
    }
    return PyBool_FromLong(PyUnicode_KIND(text) == PyUnicode_4BYTE_KIND);
}

/* Whether a str holds a character whose bit is set in bits (8,192 bytes: bit c % 8 of byte c / 8 for each
 * BMP character c) or any character beyond the BMP. */
static int
marked(PyObject *text, const unsigned char *bits)
{
    int kind = PyUnicode_KIND(text), found = kind == PyUnicode_4BYTE_KIND;
    const void *data = PyUnicode_DATA(text);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(text); i < n && !found; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        found = (bits[c >> 3] >> (c & 7)) & 1;
    }
    return found;
}

static int
get_marks(PyObject *obj, Py_buffer *marks, const char *what)
{
    if (PyObject_GetBuffer(obj, marks, PyBUF_SIMPLE) < 0)
        return -1;
    if (marks->len != BMP / 8) {
        PyBuffer_Release(marks);
        PyErr_Format(PyExc_ValueError, "%s takes a bit set of 8,192 bytes", what);
        return -1;
    }
    return 0;
}

static PyObject *
any_marked(PyObject *self, PyObject *args)
{
    PyObject *text, *marks_obj;
    Py_buffer marks;
    if (!PyArg_ParseTuple(args, "UO:any_marked", &text, &marks_obj)
        || get_marks(marks_obj, &marks, "any_marked()") < 0)
        return NULL;
    int found = marked(text, marks.buf);
    PyBuffer_Release(&marks);
    return PyBool_FromLong(found);
}

/* ---- runs ---- */

static int
append_substring(PyObject *list, PyObject *text, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *part = PyUnicode_Substring(text, start, end);
    if (part == NULL)
        return -1;
    int failed = PyList_Append(list, part);
    Py_DECREF(part);
    return failed;
}

/* (Han text, words, runs of the other scripts without spaces, whether a Han character is one jieba-rs and
 * jieba segment differently), or None for text with a character beyond the BMP.
 *
 * The Han text is folded text with every maximal run of other characters replaced by one space (what
 * re.sub("[^Han]+", " ", folded) gives); the words and the runs are the maximal runs of their classes, in
 * text order (what re.findall gives). */
static PyObject *
runs(PyObject *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "runs() takes a str");
        return NULL;
    }
    if (!check_tables())
        return NULL;
    int kind = PyUnicode_KIND(text);
    if (kind == PyUnicode_4BYTE_KIND)
        Py_RETURN_NONE;
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);

    /* the Han text's length and widest character */
    Py_ssize_t han_length = 0;
    Py_UCS4 maxchar = ' ';
    int in_other = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (char_class[c] & C_HAN) {
            han_length++;
            if (c > maxchar)
                maxchar = c;
            in_other = 0;
        } else if (!in_other) {
            han_length++;
            in_other = 1;
        }
    }
    PyObject *han = PyUnicode_New(han_length, maxchar);
    PyObject *words = PyList_New(0);
    PyObject *nospace = PyList_New(0);
    if (han == NULL || words == NULL || nospace == NULL)
        goto error;
    int han_kind = PyUnicode_KIND(han);
    void *han_data = PyUnicode_DATA(han);
    Py_ssize_t j = 0, word_start = -1, nospace_start = -1;
    int differs = 0;
    in_other = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        unsigned char cls = char_class[c];
        if (cls & C_HAN) {
            PyUnicode_WRITE(han_kind, han_data, j++, c);
            differs |= cls & C_DIFFERS;
            in_other = 0;
        } else if (!in_other) {
            PyUnicode_WRITE(han_kind, han_data, j++, ' ');
            in_other = 1;
        }
        if (cls & C_WORD) {
            if (word_start < 0)
                word_start = i;
        } else if (word_start >= 0) {
            if (append_substring(words, text, word_start, i) < 0)
                goto error;
            word_start = -1;
        }
        if (cls & C_NOSPACE) {
            if (nospace_start < 0)
                nospace_start = i;
        } else if (nospace_start >= 0) {
            if (append_substring(nospace, text, nospace_start, i) < 0)
                goto error;
            nospace_start = -1;
        }
    }
    if (word_start >= 0 && append_substring(words, text, word_start, n) < 0)
        goto error;
    if (nospace_start >= 0 && append_substring(nospace, text, nospace_start, n) < 0)
        goto error;
    return Py_BuildValue("(NNNO)", han, words, nospace, differs ? Py_True : Py_False);
error:
    Py_XDECREF(han);
    Py_XDECREF(words);
    Py_XDECREF(nospace);
    return NULL;
}

/* ---- the auto tokenizer's runs of many texts ---- */

/* auto_runs(texts, marks): for each text of the list, runs(fold(text)) where the compiled paths take it the
 * whole way; the folded text itself where marks (None, or t2s's bit set as any_marked takes it) says OpenCC
 * may change it (the caller converts it, then takes its runs); None where fold or runs declines. */
static PyObject *
auto_runs(PyObject *self, PyObject *args)
{
    PyObject *texts, *marks_obj;
    if (!PyArg_ParseTuple(args, "O!O:auto_runs", &PyList_Type, &texts, &marks_obj))
        return NULL;
    Py_buffer marks = {0};
    if (marks_obj != Py_None && get_marks(marks_obj, &marks, "auto_runs()") < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(texts);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *folded = fold(NULL, PyList_GET_ITEM(texts, i)), *item;
        if (folded == NULL)
            goto error;
        if (folded == Py_None)
            item = folded;
        else if (marks.obj != NULL && marked(folded, marks.buf))
            item = folded;
        else {
            item = runs(NULL, folded);
            Py_DECREF(folded);
            if (item == NULL)
                goto error;
        }
        PyList_SET_ITEM(out, i, item);
    }
    if (marks.obj)
        PyBuffer_Release(&marks);
    return out;
error:
    Py_XDECREF(out);
    if (marks.obj)
        PyBuffer_Release(&marks);
    return NULL;
}

/* ---- token ids ---- */

static int
get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: items of %zd bytes expected", what, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Writes each token's id (a value of ``ids``, or -1 where it has none) into ``out`` (int64, one per token,
 * text after text); returns the tokens that had none, in order (a token once per occurrence). */
static PyObject *
token_ids(PyObject *self, PyObject *args)
{
    PyObject *lists, *ids, *out;
    if (!PyArg_ParseTuple(args, "O!O!O:token_ids", &PyList_Type, &lists, &PyDict_Type, &ids, &out))
        return NULL;
    Py_buffer view;
    if (get_buffer(out, &view, 8, 1, "token_ids' output") < 0)
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
    if (get_buffer(ids_obj, &ids_view, 8, 0, "ids") < 0 || get_buffer(lengths_obj, &lengths_view, 8, 0, "lengths") < 0
        || get_buffer(hashes_obj, &hashes_view, 8, 0, "hashes") < 0 || get_buffer(kinds_obj, &kinds_view, 1, 0, "kinds") < 0
        || get_buffer(sublinear_obj, &sublinear_view, 8, 0, "sublinear") < 0
        || get_buffer(out_obj, &out_view, 8, 1, "out") < 0)
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
    if (get_buffer(values_obj, &values, 8, 0, "minhashes' values") < 0 ||
        get_buffer(lengths_obj, &lengths, 8, 0, "minhashes' lengths") < 0 ||
        get_buffer(a_obj, &a, 8, 0, "minhashes' a") < 0 || get_buffer(b_obj, &b, 8, 0, "minhashes' b") < 0 ||
        get_buffer(out_obj, &out, 4, 1, "minhashes' output") < 0)
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

static PyMethodDef methods[] = {
    {"set_tables", set_tables, METH_VARARGS, "set_tables(folds, fold_unsafe, classes): the character tables."},
    {"fold", fold, METH_O, "fold(text) -> folded text, or None where the Python path must fold it."},
    {"has_astral", has_astral, METH_O, "has_astral(text) -> whether text holds a character beyond the BMP."},
    {"any_marked", any_marked, METH_VARARGS,
     "any_marked(text, marks) -> whether text holds a marked BMP character or one beyond the BMP."},
    {"auto_runs", auto_runs, METH_VARARGS,
     "auto_runs(texts, marks) -> per text: its runs, its folded text where t2s may change it, or None."},
    {"runs", runs, METH_O, "runs(folded) -> (han text, words, nospace runs, differs), or None."},
    {"token_ids", token_ids, METH_VARARGS, "token_ids(lists, ids, out) -> the tokens without an id."},
    {"simhashes", simhashes, METH_VARARGS,
     "simhashes(ids, lengths, hashes, kinds, sublinear, out, weighting, bigrams, stopwords)."},
    {"minhashes", minhashes, METH_VARARGS,
     "minhashes(values, lengths, a, b, out, isa=0) -> the instruction set used (MinHash signatures)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "simdb._native",
                                     "simdb's compiled fast paths (see simdb/native.py).", -1, methods};

PyMODINIT_FUNC
PyInit__native(void)
{
    for (int v = 0; v < 256; v++)
        for (int bit = 0; bit < 8; bit++)
            byte_signs[v][bit] = (v >> bit) & 1 ? 1.0 : -1.0;
    return PyModule_Create(&module);
}
