"""The example program of an exported folder (``main.c``), its Makefile and README.txt.

``main`` reads each input from a raw file (the bytes of a C-order array of the input's
dtype) whose shape follows its name, runs the model and writes each output to a raw file,
printing its name, dtype, shape and file. On an error it prints the library's message
and exits with the library's status code (``treadle_status``), or with 64 for its own
(usage, an unreadable file).
"""
from __future__ import annotations

import shlex

MAIN_C = r"""/* Runs an exported treadle model on inputs read from raw files.

   usage: main [--repeat N] [--null K] FOLDER OUTPUT_PREFIX FILE:SHAPE...

   FILE holds one input's elements in C order, SHAPE its dimensions as 1x3x224x224 (empty
   for a scalar: "x.bin:"). Output k is written to OUTPUT_PREFIXk.bin. --repeat N runs N
   times more and prints the median time of a run; --null K passes NULL for input K's
   buffer (to see the library's message). Exits with the library's status on its errors,
   64 on main's own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "treadle_model.h"

enum { MAIN_ERROR = 64, MAX_INPUTS = 64, MAX_RANK = 16 };

struct input { const char *file; void *data; int64_t shape[MAX_RANK]; int32_t rank;
               size_t bytes; };

static int usage(const char *message) {
    fprintf(stderr, "error: %s\nusage: main [--repeat N] [--null K] FOLDER OUTPUT_PREFIX "
            "FILE:SHAPE...\n", message);
    return MAIN_ERROR;
}

/* "file.bin:1x3x8" -> the file's bytes and the shape. */
static int read_input(char *arg, struct input *in) {
    char *colon = strrchr(arg, ':');
    if (colon == NULL)
        return usage("an input is FILE:SHAPE, as x.bin:1x3x224x224");
    *colon = 0;
    in->file = arg;
    in->rank = 0;
    for (char *dim = colon + 1; *dim != 0 && in->rank < MAX_RANK; ++in->rank) {
        in->shape[in->rank] = strtoll(dim, &dim, 10);
        if (*dim == 'x')
            ++dim;
    }
    FILE *file = fopen(arg, "rb");
    if (file == NULL) {
        fprintf(stderr, "error: %s: cannot open\n", arg);
        return MAIN_ERROR;
    }
    fseek(file, 0, SEEK_END);
    in->bytes = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    in->data = malloc(in->bytes + 1);
    size_t got = in->data == NULL ? 0 : fread(in->data, 1, in->bytes, file);
    fclose(file);
    if (got != in->bytes) {
        fprintf(stderr, "error: %s: cannot read\n", arg);
        return MAIN_ERROR;
    }
    return 0;
}

static int failed(int status, const treadle_error *error) {
    fprintf(stderr, "error: %s\n", error->message);
    return status;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int write_outputs(const treadle_model *model, const char *prefix, void **outputs,
                         int64_t **shapes) {
    for (int32_t k = 0; k < treadle_model_output_count(model); ++k) {
        const treadle_tensor_info *info = treadle_model_output(model, k);
        size_t count = 1;
        char path[4096];
        snprintf(path, sizeof path, "%s%d.bin", prefix, k);
        printf("output %d %s %s [", k, info->name, treadle_dtype_name(info->dtype));
        for (int32_t a = 0; a < info->rank; ++a) {
            printf(a ? ", %lld" : "%lld", (long long)shapes[k][a]);
            count *= (size_t)shapes[k][a];
        }
        printf("] %s\n", path);
        FILE *file = fopen(path, "wb");
        size_t bytes = count * treadle_dtype_size(info->dtype);
        if (file == NULL || fwrite(outputs[k], 1, bytes, file) != bytes) {
            fprintf(stderr, "error: %s: cannot write\n", path);
            return MAIN_ERROR;
        }
        fclose(file);
    }
    return 0;
}

/* A file must hold its shape's elements of the input's dtype: the library reads that many. */
static int check_sizes(const treadle_model *model, int32_t count, const struct input *in) {
    for (int32_t k = 0; k < count && k < treadle_model_input_count(model); ++k) {
        size_t bytes = treadle_dtype_size(treadle_model_input(model, k)->dtype);
        for (int32_t a = 0; a < in[k].rank; ++a)
            bytes *= (size_t)in[k].shape[a];
        if (bytes != in[k].bytes) {
            fprintf(stderr, "error: %s: %zu bytes, but its shape needs %zu\n", in[k].file,
                    in[k].bytes, bytes);
            return MAIN_ERROR;
        }
    }
    return 0;
}

static int run(treadle_model *model, int32_t count, struct input *in, int null_input,
               int repeat, const char *prefix) {
    if (check_sizes(model, count, in) != 0)
        return MAIN_ERROR;
    const void *data[MAX_INPUTS];
    const int64_t *input_shapes[MAX_INPUTS];
    for (int32_t k = 0; k < count; ++k) {
        data[k] = k == null_input ? NULL : in[k].data;
        input_shapes[k] = in[k].shape;
    }
    int32_t outputs = treadle_model_output_count(model);
    void *buffers[MAX_INPUTS];
    size_t bytes[MAX_INPUTS];
    int64_t *shapes[MAX_INPUTS];
    treadle_error error;
    for (int32_t k = 0; k < outputs; ++k)
        shapes[k] = calloc(MAX_RANK, sizeof(int64_t));
    int status = treadle_model_output_shapes(model, count, input_shapes, shapes, &error);
    if (status != TREADLE_OK)
        return failed(status, &error);
    for (int32_t k = 0; k < outputs; ++k) {
        const treadle_tensor_info *info = treadle_model_output(model, k);
        bytes[k] = treadle_dtype_size(info->dtype);
        for (int32_t a = 0; a < info->rank; ++a)
            bytes[k] *= (size_t)shapes[k][a];
        buffers[k] = malloc(bytes[k] + 1);
    }
    double *times = malloc(sizeof(double) * (size_t)(repeat + 1));
    for (int r = 0; r <= repeat; ++r) {
        double start = seconds();
        status = treadle_model_run(model, count, data, input_shapes, outputs, buffers, bytes,
                                   shapes, &error);
        times[r] = seconds() - start;
        if (status != TREADLE_OK)
            return failed(status, &error);
    }
    if (repeat > 0) {
        qsort(times + 1, (size_t)repeat, sizeof(double), compare);
        printf("median latency: %.6f ms over %d runs\n", 1e3 * times[1 + repeat / 2], repeat);
    }
    return write_outputs(model, prefix, buffers, shapes);
}

int main(int argc, char **argv) {
    int repeat = 0, null_input = -1, first = 1;
    for (; first + 1 < argc && strncmp(argv[first], "--", 2) == 0; first += 2) {
        if (strcmp(argv[first], "--repeat") == 0)
            repeat = atoi(argv[first + 1]);
        else if (strcmp(argv[first], "--null") == 0)
            null_input = atoi(argv[first + 1]);
        else
            return usage("unknown option");
    }
    if (argc - first < 2 || argc - first - 2 > MAX_INPUTS || repeat < 0)
        return usage("expected a folder, an output prefix and at most 64 inputs");
    struct input inputs[MAX_INPUTS];
    int32_t count = argc - first - 2;
    for (int32_t k = 0; k < count; ++k)
        if (read_input(argv[first + 2 + k], &inputs[k]) != 0)
            return MAIN_ERROR;
    treadle_model *model;
    treadle_error error;
    int status = treadle_model_create(argv[first], &model, &error);
    if (status != TREADLE_OK)
        return failed(status, &error);
    status = run(model, count, inputs, null_input, repeat, argv[first + 1]);
    treadle_model_destroy(model);
    return status;
}
"""

MAIN_COMMAND = ["cc", "-O2", "-o", "main", "main.c", "-I.", "-L.", "-ltreadle_model",
                "-Wl,-rpath,$ORIGIN"]

MAKEFILE = """\
# Builds the example program against the model's library (found beside `main` at run time).
main: main.c treadle_model.h libtreadle_model.so
\t$(CC) -O2 -Wall -o main main.c -I. -L. -ltreadle_model '-Wl,-rpath,$$ORIGIN'
"""

README = """\
A model exported by treadle {version}: {name}

  libtreadle_model.so  every kernel, the thread pool and the runtime; exports the C API
  treadle_model.h      the C API
  constants.bin        the weights (the library checks its version, size and checksum)
  main.c, Makefile     an example program
  src/                 the sources the library was built from

Inputs:
{inputs}
Outputs:
{outputs}
Build and run the example (reads raw C-order files, writes out0.bin, ...):

  {main_command}
  ./main . out {usage}

The library was built, in this folder, by:

{build}
"""


def readme(version: str, name: str, inputs: list[str], outputs: list[str],
           build: list[list[str]]) -> str:
    usage = " ".join(f"{text.split(':')[0]}.bin:SHAPE" for text in inputs)
    return README.format(
        version=version, name=name, usage=usage,
        inputs="".join(f"  {text}\n" for text in inputs),
        outputs="".join(f"  {text}\n" for text in outputs),
        main_command=shlex.join(MAIN_COMMAND),
        build="".join(f"  {shlex.join(command)}\n" for command in build))
