/* fold, the t2s check and the auto tokenizer's runs, with their character tables (see module.c). */
#include "native.h"

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

PyMethodDef simdb_text_methods[] = {
    {"set_tables", set_tables, METH_VARARGS, "set_tables(folds, fold_unsafe, classes): the character tables."},
    {"fold", fold, METH_O, "fold(text) -> folded text, or None where the Python path must fold it."},
    {"has_astral", has_astral, METH_O, "has_astral(text) -> whether text holds a character beyond the BMP."},
    {"any_marked", any_marked, METH_VARARGS,
     "any_marked(text, marks) -> whether text holds a marked BMP character or one beyond the BMP."},
    {"auto_runs", auto_runs, METH_VARARGS,
     "auto_runs(texts, marks) -> per text: its runs, its folded text where t2s may change it, or None."},
    {"runs", runs, METH_O, "runs(folded) -> (han text, words, nospace runs, differs), or None."},
    {NULL, NULL, 0, NULL},
};
