"""Timing trials on a Ray cluster: ``runner="ray"`` (the cluster RAY_ADDRESS names, the one
this machine runs, or else a new one here) or ``"ray://host:port"`` (a Ray client
address); where this process has joined a cluster already, that one. Ray comes with the
``cluster`` extra and is imported only when one of these is chosen.

The caller builds the candidates; each shared object travels to the cluster as bytes
(``ray.put``, once per library: the nodes share no files), and a task on a node writes it
into a folder of its own and times the trial there with the local runner's timer
(``runners.TRIAL_TIMER``: the measuring child), so a candidate that crashes or hangs kills
only its child, as on this machine.

- Devices: only nodes whose device key (``runners.device_key``: CPU model and ISA
  extensions) is the target's time trials; a probe task on each node reports its key,
  once per node. Where none matches, ``DeviceMismatchError`` names both keys.
- Cores: each task reserves ``threads`` of Ray's CPUs on its node, so a node runs no more
  trials than it has cores for, and binds its child to as many cores of its own, held by
  a lock file each while it runs (Ray counts cores but does not hand out which ones).
- Failures: a task whose worker dies, or that runs past its deadline (the trial's
  timeouts and START_S), is cancelled and tried once more, on another node where there
  is one; then its trial is marked failed. Every wait has a deadline: the tuner never
  hangs on the cluster.
- Concurrency: distinct trials run at once, as many as the matching nodes have cores
  for; no more are submitted, so on a cluster no other job is using, a task starts when
  it is sent and its deadline measures its own run (START_S leaves room for a short wait).
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from treadle.target import Target
from treadle.target.cpu import host
from treadle.errors import DeviceMismatchError
from treadle.tune import runners
from treadle.tune.runners import Settings, Settle, Times, Trial, device_key

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0  # a node's first task may have to start a worker process
START_S = 60.0  # beyond a trial's timeouts: a worker starting, its library arriving
# A trial's child reports its start, warm-up, three rounds and its time, each within the
# trial's timeout.
TIMEOUTS_PER_TRIAL = 6
ATTEMPTS = 2  # a trial lost with its worker is tried once more


class RayRunner:
    """Trials timed on the nodes of a Ray cluster that match the target."""

    def __init__(self, name: str):
        self.address = None if name == "ray" else name
        self.keys: dict[str, str] = {}  # device key by node id, for the nodes probed

    def __call__(self, trials: Sequence[Trial], target: Target, settings: Settings,
                 settle: Settle) -> Times:
        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False,
                     logging_level=logging.WARNING)
        slots = self._slots(device_key(target), settings.threads)
        libraries = {path: ray.put(Path(path).read_bytes())
                     for path in dict.fromkeys(t.library for t in trials)}
        return _Dispatch(settings, settle, slots, libraries).run(trials)

    def _slots(self, key: str, threads: int) -> dict[str, int]:
        """How many trials each node matching ``key`` runs at once."""
        cores = {n["NodeID"]: int(n["Resources"].get("CPU", 0)) for n in ray.nodes()
                 if n["Alive"]}
        self._probe([node for node in cores if node not in self.keys])
        slots = {node: count // threads for node, count in cores.items()
                 if self.keys.get(node) == key and count >= threads}
        if not slots:
            found = [f"{self.keys.get(node, 'no answer to the probe')} with {count} CPUs"
                     for node, count in cores.items()]
            raise DeviceMismatchError(
                f"no node of the Ray cluster {self.address or '(ray)'} can time kernels "
                f"for {key} on {threads} threads; its nodes: "
                f"{'; '.join(found) or 'none alive'}. Tune where the cluster's devices "
                "are the target's, or join nodes that have it")
        return slots

    def _probe(self, nodes: list[str]) -> None:
        """Asks each node for its device key; a node that does not answer in time is
        left out (and asked again next time)."""
        if not nodes:
            return
        refs = {_device_key_here.options(scheduling_strategy=_on(node)).remote(): node
                for node in nodes}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for ref in late:
            ray.cancel(ref, force=True)
        for ref in ready:
            try:
                self.keys[refs[ref]] = ray.get(ref, timeout=PROBE_TIMEOUT_S)
            except RayError as err:
                log.warning("tuning: node %s did not say what device it has: %s",
                            refs[ref], err)


@dataclass(frozen=True)
class _Flight:
    """A trial's task: where it runs, until when, and which attempt it is."""
    trial: Trial
    node: str
    deadline: float
    attempt: int


class _Dispatch:
    """Sends trials to nodes with room for them, collects their times, retries lost ones."""

    def __init__(self, settings: Settings, settle: Settle, slots: dict[str, int],
                 libraries: dict):
        self.settings, self.settle, self.libraries = settings, settle, libraries
        self.free = slots  # trials each node may take on now
        self.timer = runners.TRIAL_TIMER
        self.waiting: collections.deque = collections.deque()  # (trial, attempt, node to avoid)
        self.flying: dict = {}  # ObjectRef -> _Flight
        self.results: Times = {}

    def run(self, trials: Sequence[Trial]) -> Times:
        self.waiting.extend((t, 1, None) for t in trials)
        while self.waiting or self.flying:
            self._launch()
            if not self.flying:  # every node has died
                for trial, _, _ in self.waiting:
                    self._failed(trial, "no node of the cluster is left")
                break
            wait = min(f.deadline for f in self.flying.values()) - time.monotonic()
            ready, _ = ray.wait(list(self.flying), num_returns=1, timeout=max(wait, 0.0))
            for ref in ready:
                self._collect(ref)
            self._expire()
        return self.results

    def _launch(self) -> None:
        while self.waiting and any(self.free.values()):
            trial, attempt, avoid = self.waiting.popleft()
            node = max(self.free, key=lambda n: (self.free[n] > 0, n != avoid, self.free[n]))
            self.free[node] -= 1
            settings = self.settings
            ref = _time_here.options(num_cpus=settings.threads,
                                     scheduling_strategy=_on(node)).remote(
                self.libraries[trial.library], trial, settings, self.timer)
            deadline = time.monotonic() + TIMEOUTS_PER_TRIAL * settings.timeout + START_S
            self.flying[ref] = _Flight(trial, node, deadline, attempt)

    def _collect(self, ref) -> None:
        flight = self._land(ref)
        try:
            times = ray.get(ref, timeout=START_S)
        except RayError as err:
            self._lost(flight, f"{type(err).__name__}: {str(err).splitlines()[0]}")
        else:
            for index in (k for k, seconds in times.items() if seconds is None):
                log.warning("tuning: candidate %s %s failed on node %s (its Ray worker's log "
                            "says how)", index, flight.trial.label, flight.node)
            self.results.update(times)
            self.settle(list(times.values()))

    def _expire(self) -> None:
        now = time.monotonic()
        for ref in [r for r, f in self.flying.items() if f.deadline < now]:
            ray.cancel(ref, force=True)
            self._lost(self._land(ref), "it ran past its deadline")

    def _land(self, ref) -> _Flight:
        flight = self.flying.pop(ref)
        if flight.node in self.free:
            self.free[flight.node] += 1
        return flight

    def _lost(self, flight: _Flight, why: str) -> None:
        """A task that died or hung: its trial tried again elsewhere, or failed."""
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        self.free = {node: count for node, count in self.free.items() if node in alive}
        if flight.attempt < ATTEMPTS:
            log.warning("tuning: candidate %s %s was lost on node %s (%s); trying again",
                        flight.trial.index, flight.trial.label, flight.node, why)
            self.waiting.append((flight.trial, flight.attempt + 1, flight.node))
        else:
            self._failed(flight.trial, f"lost twice; last on node {flight.node}: {why}")

    def _failed(self, trial: Trial, why: str) -> None:
        log.warning("tuning: candidate %s %s failed: %s", trial.index, trial.label, why)
        self.results[trial.index] = None
        self.settle([None])


def _on(node: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node, soft=False)


@ray.remote(num_cpus=0, max_retries=0)
def _device_key_here() -> str:
    return device_key(host())


@ray.remote(max_retries=0)  # a lost trial is retried by _Dispatch, elsewhere
def _time_here(library: bytes, trial: Trial, settings: Settings, timer) -> Times:
    """The trial timed on this node, from its library's bytes."""
    with tempfile.TemporaryDirectory(prefix="treadle-trial-") as folder, \
            _reserved_cores(settings.threads) as cores:
        path = Path(folder) / "candidates.so"
        path.write_bytes(library)
        return timer([replace(trial, library=str(path))], replace(settings, cores=cores),
                     lambda times: None)


@contextlib.contextmanager
def _reserved_cores(count: int) -> Iterator[tuple[int, ...] | None]:
    """``count`` cores of this node that no other trial holds, held while the block runs
    by a lock file each (the kernel drops the lock of a worker that dies); None where
    fewer are free, then the child runs unbound."""
    folder = Path(tempfile.gettempdir()) / f"treadle-cores-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    held = []
    try:
        for core in sorted(os.sched_getaffinity(0)):
            if len(held) == count:
                break
            lock = open(folder / f"{core}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            held.append((core, lock))
        yield tuple(core for core, _ in held) if len(held) == count else None
    finally:
        for _, lock in held:
            lock.close()
