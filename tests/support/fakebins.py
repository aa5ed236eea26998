"""Fake nvidia-smi, systemctl, busctl and nsenter for the remediation tests.

Each is a small program put first on PATH: it appends its argv (one JSON list
a line) to ``calls.log`` in its directory and answers from files there:
``pids`` (compute processes on the GPU), ``persistence`` (Enabled/Disabled),
``mig`` (Enabled/Disabled), ``reset_fails`` (present: the reset answers as
the real one does when something holds the GPU: exit 255), ``query_fails``,
``fail_<name>`` (that program exits 1). A reboot changes nothing by itself:
the test changes the boot ID file, as a real boot would.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = r'''#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
name = os.path.basename(sys.argv[0])
with open(os.path.join(here, "calls.log"), "a") as fh:
    fh.write(json.dumps([name] + sys.argv[1:]) + "\n")
def read(f, default=""):
    try:
        return open(os.path.join(here, f)).read().strip()
    except OSError:
        return default
if os.path.exists(os.path.join(here, "fail_" + name)):
    print(name + ": failed (fake)", file=sys.stderr)
    sys.exit(1)
args = sys.argv[1:]
if name == "nvidia-smi":
    if "--gpu-reset" in args or "-r" in args:
        if os.path.exists(os.path.join(here, "reset_fails")):
            print("The following GPUs could not be reset:")
            print("  GPU 00000000:1A:00.0: In use by another client")
            print("")
            print("1 device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes using this device and all compute applications running in the system.")
            sys.exit(255)
        print("GPU 00000000:1A:00.0 was successfully reset.")
        sys.exit(0)
    if os.path.exists(os.path.join(here, "query_fails")):
        print("Unable to determine the device handle for GPU: Unknown Error")
        sys.exit(15)
    q = next((a for a in args if a.startswith("--query")), "")
    if q.startswith("--query-compute-apps"):
        print(read("pids"))
    elif q == "--query-gpu=persistence_mode":
        print(read("persistence", "Enabled"))
    elif q == "--query-gpu=mig.mode.current":
        print(read("mig", "[N/A]"))
    elif "-pm" in args:
        mode = args[args.index("-pm") + 1]
        open(os.path.join(here, "persistence"), "w").write("Enabled" if mode == "1" else "Disabled")
        print("Persistence mode set to %s for GPU 00000000:1A:00.0." % ("Enabled" if mode == "1" else "Disabled"))
    elif "-q" in args:
        print("==============NVSMI LOG==============")
sys.exit(0)
'''

NAMES = ("nvidia-smi", "systemctl", "busctl", "nsenter", "reboot-node", "retire-node")


class FakeBins:
    def __init__(self, root: Path) -> None:
        self.dir = root / "bin"
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in NAMES:
            p = self.dir / name
            p.write_text(SCRIPT.replace("{python}", sys.executable))
            p.chmod(0o755)
        self.log = self.dir / "calls.log"

    def env_path(self) -> str:
        return f"{self.dir}:{os.environ.get('PATH', '')}"

    def calls(self, name: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r[1:] if name else r for r in rows if name is None or r[0] == name]

    def set(self, name: str, value: str | None) -> None:
        p = self.dir / name
        if value is None:
            p.unlink(missing_ok=True)
        else:
            p.write_text(value)

    def path(self, name: str) -> str:
        return str(self.dir / name)


class FakeProc:
    """A procfs root with the boot ID and uptime a test changes."""

    def __init__(self, root: Path) -> None:
        self.root = root / "proc"
        (self.root / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
        self.boot("11111111-1111-1111-1111-111111111111")
        self.uptime(99_999.0)

    def boot(self, boot_id: str) -> None:
        (self.root / "sys/kernel/random/boot_id").write_text(boot_id + "\n")

    def uptime(self, seconds: float) -> None:
        (self.root / "uptime").write_text(f"{seconds:.2f} 12345.67\n")
