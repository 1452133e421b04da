"""Stopping a long-running cluster command (the scheduler, the device plugin, the node agent) on a signal."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("pyvgpu.cluster")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: the command's loops wait on it and return."""
    stop = threading.Event()

    def handler(signum, frame):
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
