"""Pinning the kernels' OpenMP worker threads, each to a core of its own.

A worker that has slept (the OpenMP runtime parks it a few milliseconds after a parallel
loop) is woken by the thread that reaches the next parallel loop, and Linux tends to wake
it on that thread's core when the machine has been idle: both threads then share one core
until the scheduler moves one, and the first kernels of a call run at half speed or worse.
A MobileNetV2 called every 100 ms took 15.6 ms instead of 4.8 (ONNX Runtime: 5.5); with
its worker pinned, 6.1 ms, as a pinned worker wakes on its own core. The calling thread is
left alone: it is the user's, and the threads it starts later would inherit its mask.

Worker k (OpenMP thread number k >= 1, the same OS thread for every team of the same size)
goes to the k-th core the calling thread may use. Nothing is pinned where there are more
threads than such cores, where ``TREADLE_PIN_WORKERS=0``, or where the user places threads
through OpenMP's own variables (see config).
"""
from __future__ import annotations

import ctypes
import functools
import os

from treadle.backend.build import build
from treadle.config import config

SOURCE = """\
#include <omp.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The Linux thread id of each OpenMP thread of a team of `threads`, by thread number. */
void treadle_thread_ids(int32_t threads, int64_t *ids) {
    #pragma omp parallel num_threads(threads)
    ids[omp_get_thread_num()] = (int64_t)syscall(SYS_gettid);
}
"""


def pin_workers() -> None:
    """Pins the worker threads of the calling thread's OpenMP team (see module doc)."""
    threads = config.num_threads
    # sched_setaffinity is Linux's; elsewhere the workers stay where the OS puts them.
    if not (config.pin_workers and threads >= 2 and hasattr(os, "sched_setaffinity")):
        return
    cores = sorted(os.sched_getaffinity(0))
    if threads > len(cores):
        return
    ids = (ctypes.c_int64 * threads)()
    _library().treadle_thread_ids(threads, ids)
    for number in range(1, threads):
        try:
            os.sched_setaffinity(ids[number], {cores[number]})
        except OSError:  # not permitted here (a container's policy): run unpinned
            return


@functools.cache
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(str(build(SOURCE, "thread_ids")))
    library.treadle_thread_ids.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]
    library.treadle_thread_ids.restype = None
    return library
