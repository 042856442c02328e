'''The part of ``model.c`` that is the same for every model: loading the constants,
binding the symbolic sizes, planning the arena and running the steps.

It follows the tables ``model_source`` writes before it (see there). A run binds each
symbol from the first input dimension that is the symbol alone, evaluates every
dimension the model names (``compute_dims``), checks the inputs against theirs, sizes the
arena's tensors and places them first-fit over their lifetimes, largest first, as
``runtime.executor`` does. The placement depends only on the symbols' values, so the
model keeps the last one it made and a run with the same values copies it. Each run
borrows a context (its arena, its argument words) from the model's free list and hands
it back, so concurrent runs never share scratch memory.
'''

RUNTIME = r"""
/* ---- the runtime: the same for every model ------------------------------------------ */

enum { ALIGN = 64, HEADER_BYTES = 128, SPIN_US = 5000, MAGIC_BYTES = 8, TEXT_BYTES = 32 };

/* Buffers of a few MB (weights, a CNN's arena) go on 2 MB pages where the kernel allows
   it, as numpy's large arrays do for the Python runtime: on 4 KB pages the layers' weight
   and activation reads missed the TLB (ResNet-50 ran 8% slower than from Python). */
enum { HUGE_PAGE = 2 << 20, HUGE_FROM = 4 << 20 };

static int allocate(void **memory, size_t bytes) {
    size_t align = bytes >= HUGE_FROM ? HUGE_PAGE : ALIGN;
    if (posix_memalign(memory, align, bytes) != 0)
        return -1;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_FROM)
        madvise(*memory, bytes, MADV_HUGEPAGE);
#endif
    return 0;
}
static const char MAGIC[MAGIC_BYTES] = "TREADLEK";

struct context {                 /* one run's scratch memory */
    struct context *next;        /* in the model's free list */
    void *arena;
    size_t arena_bytes;
    int64_t *words;              /* N_WORDS argument words */
    int64_t *offsets;            /* N_ARENA placements */
    int64_t *sizes;              /* N_ARENA byte counts */
    int64_t *order;              /* scratch of the placement: (bytes, index) pairs */
    int64_t *busy;               /* scratch of the placement: (offset, end) pairs */
};

struct treadle_model {
    void *constants;
    int64_t words[N_WORDS];      /* the constants' addresses, the rest 0 */
    pthread_mutex_t lock;        /* guards `free` and the placement kept below */
    struct context *free;
    int plan_valid;
    int64_t plan_symbols[N_SYMBOLS + 1];
    int64_t plan_offsets[N_ARENA + 1];
    int64_t plan_bytes;
};

struct call {                    /* what a run knows once its inputs are checked */
    int64_t symbols[N_SYMBOLS + 1];
    int64_t dims[N_DIMS + 1];
};

static int fail(treadle_error *error, int status, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(treadle_error *error, int status, const char *format, ...) {
    if (error != NULL) {
        va_list args;
        va_start(args, format);
        vsnprintf(error->message, sizeof error->message, format, args);
        va_end(args);
    }
    return status;
}

static int succeed(treadle_error *error) {
    if (error != NULL)
        error->message[0] = 0;
    return TREADLE_OK;
}

enum { DTYPE_COUNT = sizeof DTYPE_SIZES / sizeof DTYPE_SIZES[0] };

const char *treadle_dtype_name(treadle_dtype dtype) {
    return (unsigned)dtype < DTYPE_COUNT ? DTYPE_NAMES[dtype] : "unknown";
}

size_t treadle_dtype_size(treadle_dtype dtype) {
    return (unsigned)dtype < DTYPE_COUNT ? DTYPE_SIZES[dtype] : 0;
}

/* ---- threads ---- */

static int32_t default_threads(void) {
    const char *text = getenv("TREADLE_NUM_THREADS");
    if (text != NULL && atoi(text) > 0)
        return atoi(text);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    return 1;
}

static _Atomic int32_t chosen_threads;   /* by treadle_set_num_threads; 0: the default */

void treadle_set_num_threads(int32_t threads) {
    chosen_threads = threads > 0 ? threads : 1;
    set_threads(chosen_threads);
}

/* As the Python runtime does: worker k pinned to the k-th core this thread may use
   (TREADLE_PIN_WORKERS=0 turns it off), once per process. */
static void configure_threads(void) {
    int32_t cpus[CPU_SETSIZE], count = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int32_t cpu = 0; cpu < CPU_SETSIZE; ++cpu)
            if (CPU_ISSET(cpu, &set))
                cpus[count++] = cpu;
    int32_t threads = chosen_threads > 0 ? chosen_threads : default_threads();
    const char *pin = getenv("TREADLE_PIN_WORKERS");
    int pinned = !(pin != NULL && (pin[0] == 0 || strcmp(pin, "0") == 0));
    treadle_pool_configure(pinned && threads >= 2 && threads <= count, cpus, count, SPIN_US);
    set_threads(threads);
    set_parallel(treadle_parallel_for);
}

static pthread_once_t threads_configured = PTHREAD_ONCE_INIT;

/* ---- the constants file ---- */

static uint32_t crc_table[256];

static void fill_crc_table(void) {
    for (uint32_t n = 0; n < 256; ++n) {
        uint32_t c = n;
        for (int k = 0; k < 8; ++k)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

/* zlib's CRC-32, which the exporter computes with Python's zlib.crc32. */
static uint32_t crc32_of(const unsigned char *data, size_t size) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fill_crc_table);
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < size; ++i)
        crc = crc_table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

static uint64_t read_u64(const unsigned char *bytes) {
    uint64_t value = 0;
    for (int k = 7; k >= 0; --k)
        value = value << 8 | bytes[k];
    return value;
}

/* The header: magic, format (u64), treadle version and model id (text), payload bytes
   and its CRC-32 (u64 each), all little-endian. */
static int check_header(const unsigned char *h, const char *path, treadle_error *error) {
    char version[TEXT_BYTES + 1] = {0}, model[TEXT_BYTES + 1] = {0};
    if (memcmp(h, MAGIC, MAGIC_BYTES) != 0)
        return fail(error, TREADLE_ERROR_FILE, "%s: not a treadle constants file", path);
    memcpy(version, h + 16, TEXT_BYTES);
    memcpy(model, h + 16 + TEXT_BYTES, TEXT_BYTES);
    uint64_t format = read_u64(h + MAGIC_BYTES);
    if (format != TREADLE_MODEL_FORMAT || strcmp(version, TREADLE_VERSION) != 0)
        return fail(error, TREADLE_ERROR_VERSION, "%s: exported by treadle %s (format %llu); "
                    "this library is treadle %s (format %d): export the model again",
                    path, version, (unsigned long long)format, TREADLE_VERSION,
                    TREADLE_MODEL_FORMAT);
    if (strcmp(model, MODEL_ID) != 0)
        return fail(error, TREADLE_ERROR_VERSION, "%s: holds the constants of another "
                    "model (%s; this library's model is %s)", path, model, MODEL_ID);
    return TREADLE_OK;
}

static int read_constants(FILE *file, const char *path, void **payload,
                          treadle_error *error) {
    unsigned char h[HEADER_BYTES];
    if (fread(h, 1, HEADER_BYTES, file) != HEADER_BYTES)
        return fail(error, TREADLE_ERROR_FILE, "%s: damaged (shorter than its header)", path);
    int status = check_header(h, path, error);
    if (status != TREADLE_OK)
        return status;
    uint64_t size = read_u64(h + 16 + 2 * TEXT_BYTES);
    uint64_t crc = read_u64(h + 24 + 2 * TEXT_BYTES);
    if (size != PAYLOAD_BYTES)
        return fail(error, TREADLE_ERROR_FILE, "%s: damaged (its header gives %llu bytes of "
                    "constants, the model has %llu)", path, (unsigned long long)size,
                    (unsigned long long)PAYLOAD_BYTES);
    if (allocate(payload, size + 1) != 0)
        return fail(error, TREADLE_ERROR_MEMORY, "%s: no memory for %llu bytes of constants",
                    path, (unsigned long long)size);
    size_t got = fread(*payload, 1, size, file);
    if (got != size || fgetc(file) != EOF)
        return fail(error, TREADLE_ERROR_FILE, "%s: damaged (%s than %llu bytes of constants "
                    "after its header)", path, got != size ? "shorter" : "longer",
                    (unsigned long long)size);
    if (crc32_of(*payload, size) != crc || crc != PAYLOAD_CRC32)
        return fail(error, TREADLE_ERROR_FILE, "%s: damaged (its checksum differs)", path);
    return TREADLE_OK;
}

static int load_constants(treadle_model *model, const char *folder, treadle_error *error) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/constants.bin", folder) >= (int)sizeof path)
        return fail(error, TREADLE_ERROR_ARGUMENT, "folder path too long: %s", folder);
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return fail(error, TREADLE_ERROR_FILE, "%s: cannot open (%s)", path, strerror(errno));
    int status = read_constants(file, path, &model->constants, error);
    fclose(file);
    if (status != TREADLE_OK)
        return status;
    for (int32_t k = 0; k < N_CONSTANTS; ++k)
        model->words[CONSTANTS[k].word] = (int64_t)(intptr_t)model->constants
                                          + CONSTANTS[k].offset;
    return TREADLE_OK;
}

/* ---- creating and querying ---- */

int treadle_model_create(const char *folder, treadle_model **model, treadle_error *error) {
    if (folder == NULL || model == NULL)
        return fail(error, TREADLE_ERROR_ARGUMENT, "treadle_model_create: %s is NULL",
                    folder == NULL ? "folder" : "model");
    *model = NULL;
    const char *missing = missing_cpu_feature();
    if (missing != NULL)
        return fail(error, TREADLE_ERROR_CPU, "this CPU lacks %s, which the kernels of %s "
                    "use: export the model on a machine like this one", missing, folder);
    treadle_model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fail(error, TREADLE_ERROR_MEMORY, "no memory for a model");
    pthread_mutex_init(&m->lock, NULL);
    int status = load_constants(m, folder, error);
    if (status != TREADLE_OK) {
        treadle_model_destroy(m);
        return status;
    }
    pthread_once(&threads_configured, configure_threads);
    *model = m;
    return succeed(error);
}

static void free_context(struct context *c) {
    free(c->arena);
    free(c->words);
    free(c->offsets);
    free(c->sizes);
    free(c->order);
    free(c->busy);
    free(c);
}

void treadle_model_destroy(treadle_model *model) {
    if (model == NULL)
        return;
    while (model->free != NULL) {
        struct context *next = model->free->next;
        free_context(model->free);
        model->free = next;
    }
    pthread_mutex_destroy(&model->lock);
    free(model->constants);
    free(model);
}

int32_t treadle_model_input_count(const treadle_model *model) {
    return model == NULL ? 0 : N_INPUTS;
}

int32_t treadle_model_output_count(const treadle_model *model) {
    return model == NULL ? 0 : N_OUTPUTS;
}

const treadle_tensor_info *treadle_model_input(const treadle_model *model, int32_t index) {
    return model != NULL && index >= 0 && index < N_INPUTS ? &INPUT_INFO[index] : NULL;
}

const treadle_tensor_info *treadle_model_output(const treadle_model *model, int32_t index) {
    return model != NULL && index >= 0 && index < N_OUTPUTS ? &OUTPUT_INFO[index] : NULL;
}

/* ---- binding the sizes ---- */

static void format_shape(char *text, size_t size, int32_t rank, const int64_t *dims) {
    int used = snprintf(text, size, "[");
    for (int32_t a = 0; a < rank && used < (int)size; ++a)
        used += snprintf(text + used, size - used, a ? ", %lld" : "%lld", (long long)dims[a]);
    if (used < (int)size)
        snprintf(text + used, size - used, "]");
}

static int check_counts(int32_t inputs, int32_t outputs, treadle_error *error) {
    if (inputs != N_INPUTS)
        return fail(error, TREADLE_ERROR_ARGUMENT, "the model takes %d inputs (%s), got %d",
                    N_INPUTS, INPUT_NAMES, inputs);
    if (outputs != N_OUTPUTS)
        return fail(error, TREADLE_ERROR_ARGUMENT, "the model has %d outputs (%s), got %d",
                    N_OUTPUTS, OUTPUT_NAMES, outputs);
    return TREADLE_OK;
}

/* Each symbol from the first input dimension that is the symbol alone; then every input
   dimension checked against the model's, which names the input that disagrees. */
static int bind(const int64_t *const *shapes, struct call *call, treadle_error *error) {
    if (N_INPUTS > 0 && shapes == NULL)
        return fail(error, TREADLE_ERROR_ARGUMENT, "input_shapes is NULL");
    for (int32_t k = 0; k < N_INPUTS; ++k)
        if (TENSORS[INPUTS[k]].rank > 0 && shapes[k] == NULL)
            return fail(error, TREADLE_ERROR_ARGUMENT, "input %d '%s': its shape is NULL", k,
                        TENSORS[INPUTS[k]].name);
    for (int32_t v = 0; v < N_SYMBOLS; ++v)
        call->symbols[v] = shapes[BINDS[v].input][BINDS[v].axis];
    compute_dims(call->symbols, call->dims);
    for (int32_t k = 0; k < N_INPUTS; ++k) {
        const struct tensor *t = &TENSORS[INPUTS[k]];
        for (int32_t a = 0; a < t->rank; ++a) {
            int64_t want = call->dims[SHAPES[t->shape + a]], got = shapes[k][a];
            if (got == want && got >= 0)
                continue;
            char given[256];
            format_shape(given, sizeof given, t->rank, shapes[k]);
            return fail(error, TREADLE_ERROR_SHAPE, "input %d '%s': dimension %d is %lld, "
                        "expected %lld%s (shape %s, given %s)", k, t->name, a, (long long)got,
                        (long long)want, DIM_NOTES[SHAPES[t->shape + a]], t->spelled, given);
        }
    }
    return TREADLE_OK;
}

/* The bytes of tensor `t` at this call's sizes; -1 where a dimension is negative or the
   count overflows. */
static int64_t tensor_bytes(const struct tensor *t, const struct call *call) {
    int64_t bytes = (int64_t)DTYPE_SIZES[t->dtype];
    for (int32_t a = 0; a < t->rank; ++a) {
        int64_t dim = call->dims[SHAPES[t->shape + a]];
        if (dim < 0 || __builtin_mul_overflow(bytes, dim, &bytes))
            return -1;
    }
    return bytes;
}

static int size_error(const struct tensor *t, const struct call *call, treadle_error *error) {
    char dims[256];
    int64_t shape[64];
    for (int32_t a = 0; a < t->rank && a < 64; ++a)
        shape[a] = call->dims[SHAPES[t->shape + a]];
    format_shape(dims, sizeof dims, t->rank < 64 ? t->rank : 64, shape);
    return fail(error, TREADLE_ERROR_SHAPE, "tensor '%s' would have shape %s = %s for these "
                "inputs: a negative or too large size", t->name, t->spelled, dims);
}

static int write_output_shapes(const struct call *call, int64_t *const *shapes) {
    for (int32_t k = 0; shapes != NULL && k < N_OUTPUTS; ++k) {
        const struct tensor *t = &TENSORS[OUTPUTS[k]];
        for (int32_t a = 0; shapes[k] != NULL && a < t->rank; ++a)
            shapes[k][a] = call->dims[SHAPES[t->shape + a]];
    }
    return TREADLE_OK;
}

int treadle_model_output_shapes(const treadle_model *model, int32_t input_count,
                                const int64_t *const *input_shapes,
                                int64_t *const *output_shapes, treadle_error *error) {
    struct call call;
    if (model == NULL)
        return fail(error, TREADLE_ERROR_ARGUMENT, "the model is NULL");
    int status = check_counts(input_count, N_OUTPUTS, error);
    if (status == TREADLE_OK)
        status = bind(input_shapes, &call, error);
    for (int32_t k = 0; status == TREADLE_OK && k < N_OUTPUTS; ++k)
        if (tensor_bytes(&TENSORS[OUTPUTS[k]], &call) < 0)
            status = size_error(&TENSORS[OUTPUTS[k]], &call, error);
    if (status != TREADLE_OK)
        return status;
    write_output_shapes(&call, output_shapes);
    return succeed(error);
}

/* ---- the arena: contexts and placement ---- */

static struct context *new_context(void) {
    struct context *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->words = malloc(sizeof(int64_t) * (N_WORDS + 1));
    c->offsets = malloc(sizeof(int64_t) * (N_ARENA + 1));
    c->sizes = malloc(sizeof(int64_t) * (N_ARENA + 1));
    c->order = malloc(2 * sizeof(int64_t) * (N_ARENA + 1));
    c->busy = malloc(2 * sizeof(int64_t) * (N_ARENA + 1));
    if (!c->words || !c->offsets || !c->sizes || !c->order || !c->busy) {
        free_context(c);
        return NULL;
    }
    return c;
}

static struct context *take_context(treadle_model *model) {
    pthread_mutex_lock(&model->lock);
    struct context *c = model->free;
    if (c != NULL)
        model->free = c->next;
    pthread_mutex_unlock(&model->lock);
    return c != NULL ? c : new_context();
}

static void give_back(treadle_model *model, struct context *c) {
    pthread_mutex_lock(&model->lock);
    c->next = model->free;
    model->free = c;
    pthread_mutex_unlock(&model->lock);
}

/* (bytes, index) pairs: larger first, then in table order. */
static int compare_sizes(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0] ? -1 : 1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* (offset, end) pairs, by offset. */
static int compare_spans(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* First fit, largest first: each tensor at the lowest offset clear of every tensor
   already placed whose lifetime overlaps its own. */
static int64_t place(struct context *c) {
    int64_t total = 0;
    for (int64_t k = 0; k < N_ARENA; ++k) {
        c->sizes[k] = (c->sizes[k] + ALIGN - 1) / ALIGN * ALIGN;
        c->order[2 * k] = c->sizes[k];
        c->order[2 * k + 1] = k;
    }
    qsort(c->order, N_ARENA, 2 * sizeof(int64_t), compare_sizes);
    for (int64_t i = 0; i < N_ARENA; ++i) {
        int64_t k = c->order[2 * i + 1], busy = 0, offset = 0;
        for (int64_t j = 0; j < i; ++j) {
            int64_t other = c->order[2 * j + 1];
            if (ARENA[other].last < ARENA[k].first || ARENA[k].last < ARENA[other].first)
                continue;
            c->busy[2 * busy] = c->offsets[other];
            c->busy[2 * busy + 1] = c->offsets[other] + c->sizes[other];
            ++busy;
        }
        qsort(c->busy, busy, 2 * sizeof(int64_t), compare_spans);
        for (int64_t j = 0; j < busy && offset + c->sizes[k] > c->busy[2 * j]; ++j)
            offset = offset > c->busy[2 * j + 1] ? offset : c->busy[2 * j + 1];
        c->offsets[k] = offset;
        total = total > offset + c->sizes[k] ? total : offset + c->sizes[k];
    }
    return total;
}

/* This call's placement: the model's kept one where the symbols match, else a new one,
   kept in its place. */
static int64_t plan(treadle_model *model, struct context *c, const struct call *call) {
    size_t key = sizeof(int64_t) * N_SYMBOLS;
    pthread_mutex_lock(&model->lock);
    int hit = model->plan_valid && memcmp(model->plan_symbols, call->symbols, key) == 0;
    int64_t total = model->plan_bytes;
    if (hit)
        memcpy(c->offsets, model->plan_offsets, sizeof(int64_t) * N_ARENA);
    pthread_mutex_unlock(&model->lock);
    if (hit)
        return total;
    total = place(c);
    pthread_mutex_lock(&model->lock);
    memcpy(model->plan_symbols, call->symbols, key);
    memcpy(model->plan_offsets, c->offsets, sizeof(int64_t) * N_ARENA);
    model->plan_bytes = total;
    model->plan_valid = 1;
    pthread_mutex_unlock(&model->lock);
    return total;
}

static int reserve(struct context *c, int64_t bytes) {
    if ((size_t)bytes <= c->arena_bytes)
        return TREADLE_OK;
    free(c->arena);
    c->arena = NULL;
    c->arena_bytes = 0;
    if (allocate(&c->arena, (size_t)bytes) != 0)
        return TREADLE_ERROR_MEMORY;
    c->arena_bytes = (size_t)bytes;
    return TREADLE_OK;
}

/* ---- running ---- */

static int check_buffers(const void *const *inputs, void *const *outputs,
                         const size_t *output_bytes, const struct call *call,
                         int64_t *bytes, treadle_error *error) {
    if ((N_INPUTS > 0 && inputs == NULL) || (N_OUTPUTS > 0 && outputs == NULL))
        return fail(error, TREADLE_ERROR_ARGUMENT, "%s is NULL",
                    inputs == NULL ? "inputs" : "outputs");
    for (int32_t k = 0; k < N_INPUTS; ++k)
        if (inputs[k] == NULL && tensor_bytes(&TENSORS[INPUTS[k]], call) > 0)
            return fail(error, TREADLE_ERROR_ARGUMENT, "input %d '%s': its buffer is NULL",
                        k, TENSORS[INPUTS[k]].name);
    for (int32_t k = 0; k < N_OUTPUTS; ++k) {
        const struct tensor *t = &TENSORS[OUTPUTS[k]];
        bytes[k] = tensor_bytes(t, call);
        if (bytes[k] < 0)
            return size_error(t, call, error);
        if (bytes[k] > 0 && (outputs[k] == NULL || output_bytes == NULL))
            return fail(error, TREADLE_ERROR_ARGUMENT, "output %d '%s': its %s is NULL", k,
                        t->name, outputs[k] == NULL ? "buffer" : "size (output_bytes)");
        if (bytes[k] > 0 && output_bytes[k] < (size_t)bytes[k])
            return fail(error, TREADLE_ERROR_ARGUMENT, "output %d '%s': its buffer holds %zu "
                        "bytes; these inputs need %lld", k, t->name, output_bytes[k],
                        (long long)bytes[k]);
    }
    return TREADLE_OK;
}

static void fill_words(const treadle_model *model, const struct context *c,
                       const void *const *inputs, void *const *outputs) {
    memcpy(c->words, model->words, sizeof(int64_t) * N_WORDS);
    for (int32_t k = 0; k < N_INPUTS; ++k)
        c->words[TENSORS[INPUTS[k]].word] = (int64_t)(intptr_t)inputs[k];
    for (int32_t k = 0; k < N_OUTPUTS; ++k)  /* not those copied from an input */
        if (OUTPUT_SOURCES[k] < 0)
            c->words[TENSORS[OUTPUTS[k]].word] = (int64_t)(intptr_t)outputs[k];
    for (int32_t k = 0; k < N_ARENA; ++k)
        c->words[TENSORS[ARENA[k].tensor].word] = (int64_t)(intptr_t)c->arena + c->offsets[k];
}

static int kernel_error(int32_t step, int32_t status, treadle_error *error) {
    const char *const *messages = STEPS[step].messages;
    int32_t count = 0;
    while (messages[count] != NULL)
        ++count;
    const char *message = status > 0 && status <= count ? messages[status - 1] : NULL;
    char text[TREADLE_MESSAGE_SIZE];
    const char *value = message == NULL ? NULL : strstr(message, "{value}");
    if (message == NULL)
        snprintf(text, sizeof text, "unexpected status %d", status);
    else if (value == NULL || STEPS[step].fault == NULL)
        snprintf(text, sizeof text, "%s", message);
    else
        snprintf(text, sizeof text, "%.*s%lld%s", (int)(value - message), message,
                 (long long)*STEPS[step].fault, value + 7);
    return fail(error, TREADLE_ERROR_KERNEL, "step %s: %s", STEPS[step].name, text);
}

static int run_in(treadle_model *model, struct context *c, const struct call *call,
                  const void *const *inputs, void *const *outputs, const int64_t *bytes,
                  treadle_error *error) {
    for (int32_t k = 0; k < N_ARENA; ++k) {
        c->sizes[k] = tensor_bytes(&TENSORS[ARENA[k].tensor], call);
        if (c->sizes[k] < 0)
            return size_error(&TENSORS[ARENA[k].tensor], call, error);
    }
    if (reserve(c, plan(model, c, call)) != TREADLE_OK)
        return fail(error, TREADLE_ERROR_MEMORY, "no memory for the model's arena");
    fill_words(model, c, inputs, outputs);
    int32_t failed = -1;
    int32_t status = run_steps(c->words, call->symbols, bytes, &failed);
    if (status != 0)
        return kernel_error(failed, status, error);
    for (int32_t k = 0; k < N_OUTPUTS; ++k)
        if (OUTPUT_SOURCES[k] >= 0 && bytes[k] > 0)
            memcpy(outputs[k], (const void *)(intptr_t)c->words[OUTPUT_SOURCES[k]],
                   (size_t)bytes[k]);
    return TREADLE_OK;
}

int treadle_model_run(treadle_model *model, int32_t input_count, const void *const *inputs,
                      const int64_t *const *input_shapes, int32_t output_count,
                      void *const *outputs, const size_t *output_bytes,
                      int64_t *const *output_shapes, treadle_error *error) {
    struct call call;
    int64_t bytes[N_OUTPUTS + 1];
    if (model == NULL)
        return fail(error, TREADLE_ERROR_ARGUMENT, "the model is NULL");
    int status = check_counts(input_count, output_count, error);
    if (status == TREADLE_OK)
        status = bind(input_shapes, &call, error);
    if (status == TREADLE_OK)
        status = check_buffers(inputs, outputs, output_bytes, &call, bytes, error);
    if (status != TREADLE_OK)
        return status;
    struct context *c = take_context(model);
    if (c == NULL)
        return fail(error, TREADLE_ERROR_MEMORY, "no memory for a run");
    status = run_in(model, c, &call, inputs, outputs, bytes, error);
    give_back(model, c);
    if (status != TREADLE_OK)
        return status;
    write_output_shapes(&call, output_shapes);
    return succeed(error);
}
"""
