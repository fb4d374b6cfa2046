"""Ray workers: starting Ray, checking that its workers run this process's code, and one core per worker.

:func:`init_ray` starts an embedded local Ray (or joins a cluster) and :func:`check_worker_code` makes sure its
workers import the same sources as the driver: Ray puts the driver's working directory first on a worker's path,
so a driver started in another checkout would otherwise have its rows computed by that checkout's model and stored
under this one's sweep hash. :func:`pin_worker_to_a_core` gives each worker process a core of its own, since
XLA's CPU backend otherwise spreads every evaluation over all cores and N workers oversubscribe them.
"""

from __future__ import annotations

import os

from arch_space.errors import ConfigError

_PINNED: list = []  # this worker process's core lock, once taken (held for the process's lifetime)


def pin_worker_to_a_core(lock_dir: str | None = None) -> int | None:
    """Give this Ray worker one core of its own, as Ray intends for a 1-CPU task: XLA's CPU backend otherwise runs
    each evaluation on every core of the machine, so N workers oversubscribe N cores (measured on 2 cores: one
    unpinned process used 1.8 cores; two pinned processes ran at 2.0x one). The core is claimed with an advisory
    lock file per core (``flock``; released when the process dies, so a killed worker frees its core). Returns the
    core, or None when every core is taken (more workers than cores: left unpinned)."""
    import fcntl
    import tempfile

    if _PINNED:
        return _PINNED[0]
    if not hasattr(os, "sched_setaffinity"):
        return None
    lock_dir = lock_dir or os.path.join(tempfile.gettempdir(), f"codesign-cores-{os.getuid()}")
    os.makedirs(lock_dir, exist_ok=True)
    for core in sorted(os.sched_getaffinity(0)):
        fh = open(os.path.join(lock_dir, f"core-{core}.lock"), "w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        # every thread: the affinity call applies to one thread, and XLA's pool already exists (it starts when the
        # task's shared inputs are deserialised); threads started later inherit the affinity
        tids = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), {core})
            except OSError:  # a thread that has just exited
                pass
        _PINNED.extend([core, fh])
        return core
    return None


def init_ray(address: str | None, num_workers: int):
    """Embedded local Ray by default; ``auto`` or ``ray://host:port`` connects to an existing cluster. Then checks
    that the workers run this process's code (:func:`check_worker_code`)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(num_cpus=num_workers, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
                 configure_logging=True, logging_level="ERROR")
    check_worker_code()


# what to do when the workers' sources are not the driver's (both errors of check_worker_code end with it)
_CODE_FIX = "start from the checkout the package is installed from, or run `python -m codesign.main` in this one"


def compare_code(driver: tuple[str, str], worker: tuple[str, str]) -> None:
    """One line naming both source trees when a worker's code differs from the driver's."""
    if driver[0] != worker[0]:
        raise ConfigError("ray workers", f"evaluate the sources in {worker[1]} (fingerprint {worker[0]}) but this "
                          f"process imported {driver[1]} ({driver[0]}): Ray puts the working directory first on its "
                          f"workers' path, so {_CODE_FIX}")


def check_worker_code() -> None:
    """Ray workers put the driver's working directory first on ``sys.path``: a driver whose package is installed
    from one checkout, started in another (a git worktree, a copy with local edits), would have its workers evaluate
    the other checkout's model and store its rows under this one's sweep hash, silently. One task on a worker
    compares the fingerprints (a cluster's workers are held to the same sources)."""
    import ray

    def identity():
        # nested, so Ray ships it by value: a worker importing another checkout may not have this module's functions;
        # the fingerprint of the packages that compute rows, as imported where it runs, and where they are
        import importlib
        from pathlib import Path

        from sweeps.store import source_fingerprint

        dirs = [Path(importlib.import_module(n).__file__).parent for n in ("arch_space", "serving", "sweeps")]
        return source_fingerprint(*dirs), str(dirs[0].parent)

    ours = identity()
    try:
        theirs = ray.get(ray.remote(identity).remote())
    except ray.exceptions.RayTaskError as err:  # the worker's packages could not even run the check
        raise ConfigError("ray workers", f"could not fingerprint their sources ({type(err.cause).__name__}) while "
                          f"this process imported {ours[1]}: {_CODE_FIX}") from err
    compare_code(ours, theirs)


__all__ = ["init_ray", "check_worker_code", "compare_code", "pin_worker_to_a_core"]
