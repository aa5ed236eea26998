"""systemd notify protocol (sd_notify(3)) without a dependency.

A datagram to the AF_UNIX socket in $NOTIFY_SOCKET; a leading "@" names the
abstract namespace. The watchdog interval comes from $WATCHDOG_USEC (and only
for our pid, when $WATCHDOG_PID is set); the daemon pings at half of it from
its scheduler loop, so a stalled loop stops the pings and systemd restarts us.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self._addr: str | bytes | None = None
        if path.startswith("@"):
            self._addr = b"\0" + path[1:].encode()
        elif path.startswith("/"):
            self._addr = path
        self._sock: socket.socket | None = None
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._last_ping = 0.0
        self._last_status = ""

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def send(self, *lines: str) -> bool:
        if self._addr is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self._addr)
            return True
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False

    def ready(self, status: str) -> None:
        self._last_status = status
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._last_status = status
            self.send(f"STATUS={status}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def reloading(self) -> None:
        self.send("RELOADING=1")

    def watchdog(self) -> None:
        """Ping if half the watchdog interval has passed; call from the main loop."""
        if self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")
