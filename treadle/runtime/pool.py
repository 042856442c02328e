"""The thread pool that runs the parallel loops of generated kernels.

A parallel loop's body is a C function of an iteration range (``backend.c`` outlines it);
the kernel hands it to ``treadle_parallel_for``, which splits the iterations into one
contiguous range per thread, as a static schedule would, and lets every thread claim
chunks: its own range first, then what is left of the others'. The calling thread works
too and never waits for a worker that has not started: it finishes the ranges no one has
claimed and waits only for chunks already running. An OpenMP loop instead ends at a
barrier every thread must reach, so a worker that wakes late (a halted virtual CPU) or
shares its core with another process holds up every loop: MobileNetV2 called every
100 ms beside a busy process took 104-235 ms under OpenMP (ONNX Runtime 16-19 ms) and
10.3 ms on this pool (ONNX Runtime 17.8 ms); on a quiet machine both run it in 5.3 ms.

Workers start on the first loop that wants them and, after a loop, wait for the next one:
a short spin, then yielding the core (a process beside them runs) for ``SPIN_US``, then
asleep on a futex. Pinning (``TREADLE_PIN_WORKERS``): worker k runs on the k-th core the
loading thread may use, so a woken worker wakes on its own core instead of beside the
thread that woke it; the calling thread is the user's and is never pinned. One loop runs
at a time: a loop started while another runs (a second Python thread calling a model)
runs serially on its own thread.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from treadle.backend.cpu import build
from treadle.backend.elf import open_library
from treadle.config import config

SPIN_US = 5000  # how long an idle worker stays awake for the next loop

SOURCE = r"""
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

typedef void (*treadle_loop_body)(void *ctx, int64_t begin, int64_t end);

enum { MAX_THREADS = 256, LINE = 64, PAUSE_NS = 50000 };

struct range { _Atomic int64_t next; int64_t end; char pad[LINE - 16]; };

struct job {
    treadle_loop_body body;
    void *ctx;
    int64_t chunk;
    int32_t parts;
    _Atomic int64_t done;
    struct range ranges[MAX_THREADS] __attribute__((aligned(LINE)));
};

static struct {
    pthread_mutex_t running;          /* held by the thread whose loop runs */
    _Atomic(struct job *) job;        /* the running loop, or NULL */
    _Atomic uint32_t epoch;           /* bumped per loop: what idle workers watch */
    _Atomic int32_t sleepers;
    _Atomic int32_t inside;           /* workers that may still read `job` */
    _Atomic int32_t workers;
    _Atomic int32_t helpers;          /* workers the running loop may use */
    pthread_t threads[MAX_THREADS];
    int64_t ids[MAX_THREADS];         /* Linux thread ids, for tests and tools */
    int32_t pin, cpu_count, cpus[MAX_THREADS];
    int64_t spin_ns;
} pool = { .running = PTHREAD_MUTEX_INITIALIZER };  /* spin_ns: configure */

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void place(int32_t worker) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (pool.pin && worker < pool.cpu_count) {
        CPU_SET(pool.cpus[worker], &set);
    } else {
        for (int32_t k = 0; k < pool.cpu_count; ++k)
            CPU_SET(pool.cpus[k], &set);
    }
    if (pool.cpu_count > 0)
        pthread_setaffinity_np(pool.threads[worker], sizeof set, &set);
}

/* Own range first, then the others': a late thread's iterations go to running ones. */
static void work(struct job *job, int32_t own) {
    for (int32_t k = 0; k < job->parts; ++k) {
        struct range *r = &job->ranges[(own + k) % job->parts];
        for (;;) {
            int64_t begin = atomic_fetch_add(&r->next, job->chunk);
            if (begin >= r->end)
                break;
            int64_t end = begin + job->chunk < r->end ? begin + job->chunk : r->end;
            job->body(job->ctx, begin, end);
            atomic_fetch_add(&job->done, end - begin);
        }
    }
}

static uint32_t await_loop(uint32_t seen) {
    int64_t start = now_ns();
    uint32_t epoch;
    for (int64_t spins = 0; (epoch = atomic_load(&pool.epoch)) == seen; ++spins) {
        relax();
        if (spins % 64 != 63)
            continue;
        int64_t waited = now_ns() - start;
        if (waited < PAUSE_NS)
            continue;
        if (waited < pool.spin_ns) {
            sched_yield();
            continue;
        }
        atomic_fetch_add(&pool.sleepers, 1);
        if (atomic_load(&pool.epoch) == seen)
            syscall(SYS_futex, &pool.epoch, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        atomic_fetch_sub(&pool.sleepers, 1);
        start = now_ns();
    }
    return epoch;
}

static void *worker_main(void *arg) {
    int32_t worker = (int32_t)(intptr_t)arg;   /* 1, 2, ...; the caller is 0 */
    pool.ids[worker] = (int64_t)syscall(SYS_gettid);
    uint32_t seen = atomic_load(&pool.epoch);
    for (;;) {
        seen = await_loop(seen);
        atomic_fetch_add(&pool.inside, 1);
        struct job *job = atomic_load(&pool.job);
        if (job != NULL && worker <= atomic_load(&pool.helpers))
            work(job, worker % job->parts);
        atomic_fetch_sub(&pool.inside, 1);
    }
    return NULL;
}

static int32_t start_workers(int32_t wanted) {
    int32_t count = atomic_load(&pool.workers);
    for (; count < wanted; ++count) {
        int32_t worker = count + 1;
        if (pthread_create(&pool.threads[worker], NULL, worker_main,
                           (void *)(intptr_t)worker) != 0)
            break;
        pthread_detach(pool.threads[worker]);
        place(worker);
        atomic_store(&pool.workers, worker);
    }
    return count < wanted ? count : wanted;
}

static void wait_until(_Atomic int64_t *value, int64_t target) {
    for (int64_t spins = 0; atomic_load(value) < target; ++spins)
        spins < 4096 ? relax() : (void)sched_yield();
}

void treadle_parallel_for(int64_t n, treadle_loop_body body, void *ctx, int32_t threads) {
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (n <= 1 || threads <= 1 || pthread_mutex_trylock(&pool.running) != 0) {
        body(ctx, 0, n);
        return;
    }
    int32_t helpers = start_workers(threads - 1);
    int32_t parts = helpers + 1 < n ? helpers + 1 : (int32_t)n;
    static struct job job;   /* guarded by `running` */
    job.body = body;
    job.ctx = ctx;
    job.parts = parts;
    int64_t per = (n + parts - 1) / parts;
    /* a few macro-tiles: one at a time; many rows: an eighth of a range at a time */
    job.chunk = per / 8 > 1 ? per / 8 : 1;
    atomic_store(&job.done, 0);
    for (int32_t p = 0; p < parts; ++p) {
        atomic_store(&job.ranges[p].next, p * per < n ? p * per : n);
        job.ranges[p].end = (p + 1) * per < n ? (p + 1) * per : n;
    }
    atomic_store(&pool.helpers, helpers);
    atomic_store(&pool.job, &job);
    atomic_fetch_add(&pool.epoch, 1);
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.epoch, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    work(&job, 0);
    wait_until(&job.done, n);
    atomic_store(&pool.job, NULL);
    /* the next loop reuses `job`: no worker may still be reading this one */
    for (int64_t spins = 0; atomic_load(&pool.inside) > 0; ++spins)
        spins < 4096 ? relax() : (void)sched_yield();
    pthread_mutex_unlock(&pool.running);
}

void treadle_pool_configure(int32_t pin, const int32_t *cpus, int32_t count,
                            int64_t spin_us) {
    pthread_mutex_lock(&pool.running);
    pool.pin = pin;
    pool.cpu_count = count < MAX_THREADS ? count : MAX_THREADS;
    memcpy(pool.cpus, cpus, sizeof(int32_t) * pool.cpu_count);
    pool.spin_ns = spin_us * 1000;
    for (int32_t worker = 1; worker <= atomic_load(&pool.workers); ++worker)
        place(worker);
    pthread_mutex_unlock(&pool.running);
}

/* Linux thread ids of workers 1..count (0 for one not started). */
void treadle_pool_worker_ids(int32_t count, int64_t *ids) {
    for (int32_t worker = 1; worker <= count && worker < MAX_THREADS; ++worker)
        ids[worker - 1] = worker <= atomic_load(&pool.workers) ? pool.ids[worker] : 0;
}

/* A child process has none of the parent's threads: it starts workers of its own. */
static void forget_workers(void) {
    pthread_mutex_init(&pool.running, NULL);
    atomic_store(&pool.job, NULL);
    atomic_store(&pool.workers, 0);
    atomic_store(&pool.inside, 0);
    atomic_store(&pool.sleepers, 0);
}

__attribute__((constructor)) static void register_fork_handler(void) {
    pthread_atfork(NULL, NULL, forget_workers);
}
"""


SYMBOLS = ("treadle_pool_configure", "treadle_pool_worker_ids", "treadle_parallel_for")


def _built() -> Path:
    return build(SOURCE, "thread_pool", SYMBOLS)


_loaded: list[tuple[Path, ctypes.CDLL]] = []  # the pool of this process, once opened
_lock = threading.Lock()


def _library(saved: Path | None = None) -> tuple[Path, ctypes.CDLL]:
    """The pool's shared object and its path: the one already open, else ``saved`` (a
    saved model's copy, for a process without a C compiler), else built from SOURCE."""
    with _lock:
        if not _loaded:
            path = saved if saved is not None else _built()
            library = open_library(path, SYMBOLS)
            library.treadle_pool_configure.argtypes = [
                ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_int64]
            library.treadle_pool_configure.restype = None
            library.treadle_pool_worker_ids.argtypes = [ctypes.c_int32,
                                                        ctypes.POINTER(ctypes.c_int64)]
            library.treadle_pool_worker_ids.restype = None
            _loaded.append((Path(path), library))
        return _loaded[0]


def library_path(saved: Path | None = None) -> Path:
    """The path of the pool's shared object (see _library), which a saved model copies;
    where the saved model it came from is gone, the cache's copy."""
    path = _library(saved)[0]
    return path if path.exists() else _built()


def parallel_for_address() -> int:
    """The address of ``treadle_parallel_for``, which every kernel library is given, after
    applying the current pinning setting to the pool."""
    library = _library()[1]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = config.pin_workers and 2 <= config.num_threads <= len(cores)
    library.treadle_pool_configure(int(pin), (ctypes.c_int32 * len(cores))(*cores),
                                   len(cores), SPIN_US)
    return ctypes.cast(library.treadle_parallel_for, ctypes.c_void_p).value


def worker_ids(count: int) -> list[int]:
    """Linux thread ids of the first ``count`` workers (0 for one not started yet)."""
    ids = (ctypes.c_int64 * count)()
    _library()[1].treadle_pool_worker_ids(count, ids)
    return list(ids)
