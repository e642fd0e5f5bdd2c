"""The rule every child process pingctl starts follows: it dies with its parent, however the
parent ends (kill -9, the OOM killer). A worker left behind holds its memory and its CPU, and
works on for an output its dead parent will never publish. Used by ingest's pool, the Grain
loader's workers, the training worker and the processes `pingctl bench` measures."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's prctl, looked up here (never between fork and exec), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent: int, poll_s: float = 1.0, pdeathsig: bool = True) -> None:
    """End this child process when `parent` ends, however it ends (kill -9, the OOM killer):
    call it first thing in a worker. A worker left behind holds its memory and its CPU, and
    works on for an output its dead parent will never publish. Linux: the kernel sends SIGKILL
    the moment the parent exits (PR_SET_PDEATHSIG). That signal comes when the parent's
    *thread* that started the child ends, so the thread must live as long as the child is
    needed (ingest's pool is started by the command's own thread); where a library starts
    workers from threads of its own, pass `pdeathsig=False`. Then, elsewhere, or if prctl
    fails: a daemon thread that checks os.getppid() every `poll_s` seconds."""
    prctl = _prctl() if pdeathsig else None
    armed = prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != parent:  # the parent died before this process could arm anything
        os._exit(1)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="pingctl-die-with-parent", daemon=True).start()


def die_with_us():
    """A `preexec_fn` for subprocess.Popen making the child die with this process (Linux; None
    elsewhere). It only calls prctl, looked up before the fork, and getppid."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child between fork and exec; PDEATHSIG survives the exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm
