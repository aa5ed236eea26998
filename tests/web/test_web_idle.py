"""The /metrics thread sleeps until a connection arrives or stop() (issue 29): no wake-up every 0.5 s
to look for a shutdown request, as ``serve_forever`` does."""

from __future__ import annotations

import threading
import time
import urllib.request

from agentproc import free_port, wait_for

from agent.config import MetricsSection
from agent.metrics import build_registry
from agent.registry import CATALOG
from agent.store import Store
from agent.web.server import MetricsServer


def wakeups(tid: int) -> int:
    """Voluntary context switches of thread `tid`: each time it slept and was woken."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_the_idle_server_thread_does_not_wake_and_stop_ends_it() -> None:
    store = Store()
    store.tick()
    port = free_port()
    server = MetricsServer(MetricsSection(listen=f"127.0.0.1:{port}"), build_registry(store, CATALOG), store)
    server.start()
    try:
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).status == 200
        (thread,) = [t for t in threading.enumerate() if t.name == "metrics-http"]
        assert thread.native_id is not None
        before = wakeups(thread.native_id)
        time.sleep(2.0)  # serve_forever would have woken 4 times
        assert wakeups(thread.native_id) - before == 0
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10).status == 200
        assert wakeups(thread.native_id) - before >= 1, "a connection wakes it"
    finally:
        server.stop()
    wait_for(lambda: not thread.is_alive(), what="the server thread ends on stop()")
    server.stop()  # a second stop() is harmless
