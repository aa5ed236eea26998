"""The release wheels, built by CI for hosts and the DaemonSet image.

    python build_backend/release_wheel.py [--out dist] [--manylinux 2_34]

Two wheels of the same version go into --out (older node_health_agent wheels
there are removed first):

- `node_health_agent-V-py3-none-manylinux_2_34_<arch>.whl`: the package with
  the Rust parsers (`agent._native`). maturin builds it with
  `--compatibility manylinux_2_34 --auditwheel check`: it refuses to tag the
  wheel when the library needs a newer glibc symbol version, or a shared
  library outside the policy, than the tag promises. 2_34 is the oldest policy
  a library built against glibc ≥ 2.34 satisfies: Rust's std then links
  `pthread_key_create@GLIBC_2.34` (libpthread moved into libc in 2.34).
  `tests/core/test_release_wheel.py` holds the tag equal to the newest GLIBC
  version the library needs (`objdump -T`).
- `node_health_agent-V-py3-none-any.whl`: the pure-Python wheel (the parsers'
  Python twins), for hosts the first does not fit (an older glibc, another
  architecture, musl).

`pip install --no-index --find-links DIR node-health-agent` picks the first
where it fits and the second elsewhere; the agent says which parsers it runs
(`agent version`, the start log line, `node_health_build_info{native=…}`).

Why `py3-none` and not `cp311-abi3`: the library is loaded by cffi in ABI mode
(`ffi.dlopen`) and uses no Python C API at all (it links libc, libgcc_s and the
loader, nothing of libpython), so it is not an extension module and the
stable-ABI tag would claim what it does not use. `py3-none` (maturin's own tag
for cffi bindings) gives what abi3 would: one wheel for every CPython, here
≥ 3.11 (Requires-Python).

Nothing is downloaded: cargo builds the std-only crate offline, and maturin
must already be installed (the [test] extra has it; daemonset/constraints.txt
pins it). Without cargo or maturin the script says so in one line (exit 2).
The cargo target dir is native/target, which an editable install has
already filled, so CI's second build only packs the wheel.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICY = "2_34"
NATIVE_LIBRARY = "agent/_native/lib_native.so"


def _fail(message: str, code: int = 2) -> int:
    print(f"release_wheel: {message}", file=sys.stderr)
    return code


def _maturin() -> list[str] | None:
    if importlib.util.find_spec("maturin") is not None:
        return [sys.executable, "-m", "maturin"]
    path = shutil.which("maturin")
    return [path] if path else None


def _native_wheel(maturin: list[str], out: Path, policy: str) -> Path | str:
    """The manylinux wheel's path, or why maturin did not make one."""
    cmd = [*maturin, "build", "--release", "--interpreter", sys.executable, "--compatibility", f"manylinux_{policy}",
           "--auditwheel", "check", "--out", str(out)]
    if subprocess.run(cmd, cwd=ROOT, check=False).returncode != 0:
        return f"maturin refused the manylinux_{policy} wheel (its reason is above)"
    built = sorted(out.glob(f"node_health_agent-*-py3-none-manylinux_{policy}_*.whl"))
    if len(built) != 1:
        return f"expected one manylinux_{policy} wheel in {out}, found {[p.name for p in built]}"
    if NATIVE_LIBRARY not in zipfile.ZipFile(built[0]).namelist():
        return f"{built[0].name} has no {NATIVE_LIBRARY}"
    return built[0]


def _pure_wheel(out: Path) -> Path:
    sys.path.insert(0, str(ROOT / "build_backend"))
    import nha_build

    os.environ["NHA_NATIVE"] = "0"
    return out / nha_build.build_wheel(str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "dist"), help="where the wheels go (default: dist/)")
    parser.add_argument("--manylinux", default=POLICY, metavar="X_Y",
                        help=f"the glibc policy to tag and check (default: {POLICY})")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"2_\d+", args.manylinux):
        return _fail(f"--manylinux {args.manylinux!r}: expected a glibc version like {POLICY}")
    if shutil.which("cargo") is None:
        return _fail("no Rust toolchain (cargo) on PATH: the manylinux wheel carries the compiled parsers")
    maturin = _maturin()
    if maturin is None:
        return _fail("maturin is not installed: pip install maturin (pinned in daemonset/constraints.txt)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("node_health_agent-*.whl"):
        old.unlink()
    native = _native_wheel(maturin, out, args.manylinux)
    if isinstance(native, str):
        return _fail(native, 1)
    pure = _pure_wheel(out)
    print(f"{native}\n{pure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
