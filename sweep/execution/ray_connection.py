"""Connecting to Ray for a cluster profile.

`ray_address: local` starts Ray inside this process (the embedded default): every Ray server listens on
127.0.0.1 only and there is no dashboard, so nothing listens beyond this machine (tests/test_faults.py
checks it). Any other address joins an existing cluster that the user runs on a private network (Ray's
ports execute code: never expose them).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusters.schema import ClusterProfile
    from sweep.errors import UserError
    from sweep.execution.prestart import Prestart

# On Linux, Ray turns `_node_ip_address="127.0.0.1"` into the machine's routable address and binds its
# gRPC servers (GCS, raylet, every worker) and agents to all interfaces. It keeps 127.0.0.1 only where it
# thinks multi-node clusters are unsupported (macOS, Windows); this switch says so for the embedded Ray.
_LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def connect(profile: ClusterProfile, prestart: Prestart | None = None) -> bool:
    """Connect for `profile`; returns True if this call started Ray (and so should shut it down). The Ray it starts
    starts `prestart`'s rank processes ahead (`sweep.execution.prestart`); one it joins was started by its owner.

    A Ctrl-C or SIGTERM while Ray starts is held until the start is complete, then Ray is shut down and
    `Interrupted` raised: interrupting `ray.init` halfway leaves its agent processes running.
    """
    import ray

    from sweep.errors import debug_enabled

    if ray.is_initialized():  # a library user or a test session already connected
        return False
    quiet = not debug_enabled()
    common: dict[str, Any] = dict(
        logging_level="ERROR" if quiet else "INFO", log_to_driver=not quiet, configure_logging=True
    )
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with signals_held() as interrupted:  # ray.init sets a SIGTERM handler of its own: the block's end puts ours back
        if profile.is_embedded:
            from sweep.execution.prestart import embedded_cpus

            num_cpus = embedded_cpus(profile)
            if prestart and prestart.sides:  # their imports beside Ray's start
                prestart.start_sides()
            with loopback_only(), _environ(prestart.env() if prestart else {}):
                # address="local": always a new instance, never a cluster found in /tmp/ray or $RAY_ADDRESS
                ray.init(
                    address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", **common
                )
        else:
            join(profile, quiet, common)
    if interrupted:
        ray.shutdown()
        raise Interrupted(interrupted[0])
    return True


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block (Ray's processes, started in it, inherit them), then as they were."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def join(profile: ClusterProfile, quiet: bool, common: dict[str, Any]) -> None:
    """Connect to the running cluster at `profile.ray_address` within `profile.connect_timeout_s`, or raise a
    UserError that says why not (nothing listening, no answer, another auth mode) and what to do.

    Ray itself retries a dead address for many minutes, printing its GCS warnings: the port is tried first
    (a refused or unroutable one fails at once), and `ray.init` gets what is left of the time, its warnings
    kept back (SWEEP_DEBUG shows them) and read for the cause; past the deadline the process says so and exits 2
    (`ray.init` cannot be interrupted; nothing is written before Ray is reached)."""
    import ray
    from ray.exceptions import AuthenticationError

    timeout = profile.connect_timeout_s
    deadline = time.monotonic() + timeout
    _probe(profile, deadline)
    kept = [lambda: ""]  # what Ray printed, once it is kept back: read if the deadline passes
    late = lambda: _unreachable(profile, f"no answer from Ray within {timeout:g} s", kept[0]())  # noqa: E731
    with _exit_at(deadline, late), _stderr_kept(enabled=quiet) as kept[0]:  # the exit prints on the real stderr
        try:
            ray.init(address=profile.ray_address, **common)
        except AuthenticationError:
            raise _unreachable(
                profile, "token authentication is on here but this machine has no token", kept[0](), auth=True
            ) from None
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise _unreachable(profile, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}", kept[0]()) from None


def _probe(profile: ClusterProfile, deadline: float) -> None:
    """A TCP connection to the address's port (GCS, or a ray:// client server): nothing listening is said now."""
    from clusters.schema import ray_address_parts

    parts = ray_address_parts(profile.ray_address)  # None for `auto`: Ray finds the address
    if parts is None:
        return
    host, port = parts
    try:
        with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise _unreachable(profile, f"nothing answers on port {port} ({why})", "") from None


def _unreachable(profile: ClusterProfile, why: str, ray_output: str, auth: bool = False) -> UserError:
    """The UserError for a cluster not reached: the address, why, and what to do; an auth mismatch named."""
    from sweep.errors import UserError

    address = profile.ray_address
    mode = os.environ.get("RAY_AUTH_MODE")
    if "Unauthenticated" in ray_output or "InvalidAuthToken" in ray_output:
        why, auth = "the cluster refused this driver's token (it was started with token authentication)", True
    if auth:
        token = "the cluster's token (RAY_AUTH_TOKEN, or a copy of the head node's ~/.ray/auth_token)"
        todo = (
            f"RAY_AUTH_MODE={mode} is set here (ray.init writes it into a driver's environment, and child processes "
            f"inherit it): unset it to reach a cluster started without token authentication, or give this machine "
            f"{token}"
            if mode
            else f"give this machine {token} and set RAY_AUTH_MODE=token"
        )
    else:
        port = address.rsplit(":", 1)[-1]
        start = (
            f"ray start --head --ray-client-server-port {port}"
            if address.startswith("ray://")
            else f"ray start --head --port {port}"
            if address != "auto"
            else "ray start --head"
        )
        todo = f"start Ray there ({start}), fix ray_address in the profile, or run here with --cluster local"
    return UserError(f"cluster '{profile.name}': cannot reach Ray at {address}: {why}; {todo}")


@contextmanager
def _stderr_kept(enabled: bool) -> Iterator[Callable[[], str]]:
    """Keep what is written to fd 2 (Ray's C++ warnings too) for the block; yields a function returning it."""
    if not enabled:
        yield lambda: ""
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)

        def text() -> str:
            kept.seek(0)
            return kept.read().decode(errors="replace")

        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextmanager
def _exit_at(deadline: float, error: Callable[[], UserError]) -> Iterator[None]:
    """Past `deadline`, print `error()` (a UserError) as the CLI prints one and exit 2, whatever the main thread
    is blocked in; nothing is left to clean up then: no rows are written before Ray is reached, and a driver
    that joins a cluster has started no processes of its own."""
    from sweep.errors import one_line

    out = os.dup(2)  # the real stderr, whatever the block redirects

    def fire() -> None:
        os.write(out, f"error: {one_line(str(error()))}\n".encode())
        os._exit(2)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.close(out)


def disconnect(started: bool) -> None:
    import ray

    if started and ray.is_initialized():
        with signals_held():  # a second Ctrl-C must not cut the shutdown short and orphan Ray's processes
            ray.shutdown()


@contextmanager
def loopback_only() -> Iterator[None]:
    """Flip the switch while Ray starts its processes, then put it back (a later remote connection from
    this process must advertise a routable address)."""
    from ray._private import ray_constants

    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with _environ({_LOOPBACK_SWITCH: "0"}):
            yield
    finally:
        if saved is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved


class Interrupted(KeyboardInterrupt):
    """A stop signal (Ctrl-C's SIGINT, or SIGTERM from `timeout`, `docker stop`, a batch scheduler) acted on
    where stopping is safe; `signum` says which (the exit status is 128 + it, as a shell reports a signal)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# SIGTERM is stopped as Ctrl-C is: a scheduler's preemption must not orphan actors or write half a row.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_held() -> Iterator[list[int]]:
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
