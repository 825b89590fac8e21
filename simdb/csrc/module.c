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
 *   band_keys(...)               MinHash band keys of many signatures (simdb.methods.minhash.signature.
 *                                band_keys_array): the first 8 bytes of each band's MD5, by OpenSSL's libcrypto
 *
 * The tables (which character folds to what, which class each character is in) are built in Python from
 * the definitions simdb's regexes and unicodedata give, and handed over once by set_tables() (text.c).
 *
 * One extension module, one file per kernel: text.c (fold, the t2s check, the tokenizer's runs, and their
 * character tables), simhashes.c (token ids and SimHash sums), minhashes.c (MinHash signatures), bandkeys.c
 * (their band keys); this file puts them together (hatch_build.py compiles them).
 */
#include "native.h"

int
simdb_get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what)
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


static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "simdb._native",
                                     "simdb's compiled fast paths (see simdb/native.py).", -1, NULL};

PyMODINIT_FUNC
PyInit__native(void)
{
    simdb_simhash_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, simdb_text_methods) < 0 || PyModule_AddFunctions(m, simdb_simhash_methods) < 0
        || PyModule_AddFunctions(m, simdb_minhash_methods) < 0
        || PyModule_AddFunctions(m, simdb_band_key_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
