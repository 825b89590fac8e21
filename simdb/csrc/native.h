/* Shared by the files of simdb's compiled fast paths (one extension module, simdb._native: module.c). */
#ifndef SIMDB_NATIVE_H
#define SIMDB_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* A C-contiguous buffer of items of ``itemsize`` bytes (writable if asked), or -1 with a ValueError naming
 * ``what``. */
int simdb_get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, int writable, const char *what);

/* Each kernel's functions, added to the module by module.c. */
extern PyMethodDef simdb_text_methods[];      /* text.c: set_tables, fold, has_astral, any_marked, runs, auto_runs */
extern PyMethodDef simdb_simhash_methods[];   /* simhashes.c: token_ids, simhashes */
extern PyMethodDef simdb_minhash_methods[];   /* minhashes.c: minhashes */
extern PyMethodDef simdb_band_key_methods[];  /* bandkeys.c: band_keys (none where built without OpenSSL) */
void simdb_simhash_init(void);

#endif
