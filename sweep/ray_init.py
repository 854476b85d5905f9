"""Connecting to Ray for a cluster profile.

`ray_address: local` starts Ray inside this process (the embedded default): every Ray server listens on
127.0.0.1 only and there is no dashboard, so nothing listens beyond this machine (tests/test_faults.py
checks it). Any other address joins an existing cluster that the user runs on a private network (Ray's
ports execute code: never expose them).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

# On Linux, Ray turns `_node_ip_address="127.0.0.1"` into the machine's routable address and binds its
# gRPC servers (GCS, raylet, every worker) and agents to all interfaces. It keeps 127.0.0.1 only where it
# thinks multi-node clusters are unsupported (macOS, Windows); this switch says so for the embedded Ray.
_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def connect(profile) -> bool:
    """Connect for `profile`; returns True if this call started Ray (and so should shut it down).

    A Ctrl-C or SIGTERM while Ray starts is held until the start is complete, then Ray is shut down and
    `Interrupted` raised: interrupting `ray.init` halfway leaves its agent processes running.
    """
    import ray

    from sweep.errors import debug_enabled

    if ray.is_initialized():  # a library user or a test session already connected
        return False
    quiet = not debug_enabled()
    common = dict(logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet, configure_logging=True)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with signals_held() as interrupted:  # ray.init sets a SIGTERM handler of its own: the block's end puts ours back
        if profile.is_embedded:
            num_cpus = None if profile.is_gpu else profile.ranks_per_node * profile.cpus_per_rank
            with loopback_only():
                # address="local": always a new instance, never a cluster found in /tmp/ray or $RAY_ADDRESS
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                         **common)
        else:
            try:
                ray.init(address=profile.ray_address, **common)
            except (ConnectionError, RuntimeError, ValueError) as e:
                from sweep.errors import UserError

                raise UserError(f"cluster '{profile.name}': cannot reach Ray at {profile.ray_address} "
                                f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); start it (ray start --head) "
                                f"or fix ray_address in the profile") from None
    if interrupted:
        ray.shutdown()
        raise Interrupted(interrupted[0])
    return True


def disconnect(started: bool) -> None:
    import ray

    if started and ray.is_initialized():
        with signals_held():  # a second Ctrl-C must not cut the shutdown short and orphan Ray's processes
            ray.shutdown()


@contextmanager
def loopback_only():
    """Flip the switch while Ray starts its processes, then put it back (a later remote connection from
    this process must advertise a routable address)."""
    from ray._private import ray_constants

    saved = os.environ.get(_LOOPBACK_SWITCH), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_LOOPBACK_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop(_LOOPBACK_SWITCH, None)
        else:
            os.environ[_LOOPBACK_SWITCH] = saved[0]
        if saved[1] is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved[1]


class Interrupted(KeyboardInterrupt):
    """A stop signal (Ctrl-C's SIGINT, or SIGTERM from `timeout`, `docker stop`, a batch scheduler) acted on
    where stopping is safe; `signum` says which (the exit status is 128 + it, as a shell reports a signal)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# SIGTERM is stopped as Ctrl-C is: a scheduler's preemption must not orphan actors or write half a row.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_held():
    """Defer SIGINT and SIGTERM for the block; yields a list of the signals that arrived (empty if none).

    A Ctrl-C is recorded, never raised where it lands: a KeyboardInterrupt raised inside one of Ray's
    Cython callbacks (its signal check in `ray.wait`, an object-ref destructor) is printed as "Exception
    ignored" and lost, and the sweep would go on as if nothing had been pressed. The caller looks at the
    list where stopping is safe. SIGTERM's default (and the handler `ray.init` installs) ends the process
    at once, with exit 1 and a stack dump, leaving the trials' actors to Ray.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield received
        return
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in STOP_SIGNALS}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
