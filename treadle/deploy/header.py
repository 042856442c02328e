"""``treadle_model.h``: the C API of an exported model, the same for every model.

The dtype codes are the positions in ``DTYPES``, which the model's tables use too.
"""
from __future__ import annotations

from treadle.backend.c import c_string

# Element types a model's inputs and outputs may have, in the order of their C codes.
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool")

HEADER_NAME = "treadle_model.h"
FORMAT = 1  # of the exported folder: the library refuses constants of another format

_HEADER = """\
/* The C API of a model exported by treadle (`treadle export`, CompiledModel.export).

   A model is created from its folder, which holds this header, libtreadle_model.so and
   constants.bin. Every function that can fail returns TREADLE_OK (0) or a status code,
   and writes a message naming the input, output or file at fault into `error` (which may
   be NULL). Buffers belong to the caller: inputs are read, outputs are written, in C
   (row-major) order, and no output may overlap an input or another output.

   Several threads may run one model at once: each run takes a scratch arena of its own
   from the model (made on first need and kept for later runs until the model is
   destroyed), so concurrent runs share only the read-only constants. Creating and
   destroying a model must not overlap any other call on it. */
#ifndef TREADLE_MODEL_H
#define TREADLE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TREADLE_MODEL_FORMAT @FORMAT@
#define TREADLE_VERSION @VERSION@

typedef enum {
    TREADLE_OK = 0,
    TREADLE_ERROR_ARGUMENT = 1, /* a NULL pointer, a wrong count, an output too small */
    TREADLE_ERROR_SHAPE = 2,    /* a shape that contradicts the model or another input */
    TREADLE_ERROR_FILE = 3,     /* a file of the folder is missing, unreadable or damaged */
    TREADLE_ERROR_VERSION = 4,  /* the folder is another treadle's or another model's */
    TREADLE_ERROR_MEMORY = 5,   /* out of memory */
    TREADLE_ERROR_KERNEL = 6,   /* a check inside the model failed (an index out of range) */
    TREADLE_ERROR_CPU = 7       /* this CPU lacks an instruction set the kernels use */
} treadle_status;

typedef enum {
@DTYPES@
} treadle_dtype;

#define TREADLE_MESSAGE_SIZE 512

typedef struct {
    char message[TREADLE_MESSAGE_SIZE]; /* "" after a call that succeeded */
} treadle_error;

typedef struct {
    const char *name;
    treadle_dtype dtype;
    int32_t rank;
    const int64_t *dims;          /* each dimension's size, -1 where it is symbolic */
    const char *const *dim_names; /* each dimension as text: "3", "seq", "seq + 1" */
} treadle_tensor_info;

typedef struct treadle_model treadle_model;

/* Reads the constants from `folder`/constants.bin, checking its format, its treadle
   version, its size and its checksum; starts no thread (the kernels' workers start on
   the first run). */
int treadle_model_create(const char *folder, treadle_model **model, treadle_error *error);
void treadle_model_destroy(treadle_model *model);

int32_t treadle_model_input_count(const treadle_model *model);
int32_t treadle_model_output_count(const treadle_model *model);
/* NULL where `index` is out of range. */
const treadle_tensor_info *treadle_model_input(const treadle_model *model, int32_t index);
const treadle_tensor_info *treadle_model_output(const treadle_model *model, int32_t index);

/* The outputs' shapes for inputs of `input_shapes` (input k's dimensions at
   input_shapes[k]), into output_shapes[k] (rank elements each), without running. */
int treadle_model_output_shapes(const treadle_model *model, int32_t input_count,
                                const int64_t *const *input_shapes,
                                int64_t *const *output_shapes, treadle_error *error);

/* Runs the model. The symbolic sizes are bound from the input shapes, which must agree
   with each other; output k is written to outputs[k], which holds output_bytes[k] bytes;
   its shape goes to output_shapes[k] unless output_shapes (or that entry) is NULL. */
int treadle_model_run(treadle_model *model, int32_t input_count, const void *const *inputs,
                      const int64_t *const *input_shapes, int32_t output_count,
                      void *const *outputs, const size_t *output_bytes,
                      int64_t *const *output_shapes, treadle_error *error);

const char *treadle_dtype_name(treadle_dtype dtype);
size_t treadle_dtype_size(treadle_dtype dtype);

/* The threads each kernel's parallel loops use, for every model of this library; by
   default TREADLE_NUM_THREADS or the cores this process may run on. */
void treadle_set_num_threads(int32_t threads);

#ifdef __cplusplus
}
#endif

#endif
"""


def header(version: str) -> str:
    """The header's text for a library of treadle ``version``."""
    codes = ",\n".join(f"    TREADLE_{name.upper()} = {k}" for k, name in enumerate(DTYPES))
    return (_HEADER.replace("@FORMAT@", str(FORMAT)).replace("@VERSION@", c_string(version))
            .replace("@DTYPES@", codes))
