/* MinHash band keys (see module.c): the first 8 bytes of the MD5 of each band's bytes, as a signed big-endian
 * 64-bit integer, the key PostgreSQL computes with md5() (simdb.pg.methods.minhash.band_key_sql).
 *
 * MD5 is OpenSSL's (libcrypto, which Python's hashlib.md5 runs too): its low-level MD5_Init/Update/Final,
 * which hash in place. OpenSSL 3 marks them deprecated in favour of EVP, whose one-shot MD5() looks the
 * digest up by name on every call and whose EVP_MD fetch a FIPS-only configuration refuses; a band is 24
 * bytes, so what surrounds the hash is most of its cost. Built only where OpenSSL's headers are at hand
 * (hatch_build.py); elsewhere the module has no band_keys and the Python twin runs. */
#ifndef SIMDB_WITHOUT_OPENSSL
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include "native.h"
#include <openssl/md5.h>

/* band_keys(signatures, num_perm, rows, out): signatures are texts x num_perm uint32 in their stored byte
 * order (little-endian, C order), out (int64, texts x bands, C order) gets band b's key of each text: the
 * MD5 of the bytes of positions b * rows .. (b + 1) * rows - 1. */
static PyObject *
band_keys(PyObject *self, PyObject *args)
{
    PyObject *signatures_obj, *out_obj;
    Py_ssize_t num_perm, rows;
    if (!PyArg_ParseTuple(args, "OnnO:band_keys", &signatures_obj, &num_perm, &rows, &out_obj))
        return NULL;
    Py_buffer signatures = {0}, out = {0};
    PyObject *result = NULL;
    if (simdb_get_buffer(signatures_obj, &signatures, 4, 0, "band_keys' signatures") < 0 ||
        simdb_get_buffer(out_obj, &out, 8, 1, "band_keys' output") < 0)
        goto done;
    if (num_perm < 1 || num_perm > PY_SSIZE_T_MAX / 4 || rows < 1 || rows > num_perm ||
        signatures.len % (4 * num_perm)) {
        PyErr_SetString(PyExc_ValueError, "band_keys: the signatures must be whole rows of num_perm values, and "
                                          "a band 1 to num_perm of them");
        goto done;
    }
    Py_ssize_t texts = signatures.len / (4 * num_perm), bands = texts ? out.len / 8 / texts : 0;
    if (texts && (out.len != texts * bands * 8 || bands < 1 || bands > num_perm / rows)) {
        PyErr_SetString(PyExc_ValueError, "band_keys: the output must hold texts x bands keys, the bands within "
                                          "the signature");
        goto done;
    }
    const unsigned char *bytes = signatures.buf;
    int64_t *keys = out.buf;
    Py_ssize_t stride = 4 * num_perm, width = 4 * rows;
    Py_BEGIN_ALLOW_THREADS
    MD5_CTX context;
    unsigned char digest[MD5_DIGEST_LENGTH];
    for (Py_ssize_t t = 0; t < texts; t++) {
        for (Py_ssize_t b = 0; b < bands; b++) {
            MD5_Init(&context);
            MD5_Update(&context, bytes + t * stride + b * width, (size_t)width);
            MD5_Final(digest, &context);
            uint64_t key = 0;
            for (int i = 0; i < 8; i++)
                key = key << 8 | digest[i];
            keys[t * bands + b] = (int64_t)key;  /* two's complement, as ('x' || ...)::bit(64)::bigint */
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    if (signatures.obj) PyBuffer_Release(&signatures);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

PyMethodDef simdb_band_key_methods[] = {
    {"band_keys", band_keys, METH_VARARGS,
     "band_keys(signatures, num_perm, rows, out) -> None (MinHash band keys: the first 8 bytes of each band's MD5)."},
    {NULL, NULL, 0, NULL},
};
#else
#include "native.h"

PyMethodDef simdb_band_key_methods[] = {{NULL, NULL, 0, NULL}};
#endif
