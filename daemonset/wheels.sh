#!/bin/sh
# The image's two install steps. daemonset/Dockerfile runs them, and
# tests/test_image_install.py runs them without Docker (the second with
# CC=/bin/false, as in the runtime stage, which has no compiler).
#
#   wheels.sh build SRC WHEELS [EXTRAS]   every wheel the agent needs, into WHEELS:
#                                         its own (with the Rust crate) and each
#                                         dependency at its pin in constraints.txt,
#                                         C extensions (python-iptables) compiled here
#   wheels.sh install WHEELS [EXTRAS]     the agent from WHEELS alone: no index, no source
#
# PYTHON names the interpreter (default python3).
set -eu
py=${PYTHON:-python3}
case "${1:-}" in
build)
    src=$2 out=$3 extras=${4:-}
    pins="$src/daemonset/constraints.txt"
    "$py" -m pip install --constraint "$pins" maturin
    (cd "$src" && "$py" -m maturin build --release --out "$out")
    agent=$(ls "$out"/node_health_agent-*.whl)
    "$py" -m pip wheel --wheel-dir "$out" --constraint "$pins" "$agent${extras:+[$extras]}"
    ;;
install)
    wheels=$2 extras=${3:-}
    "$py" -m pip install --no-index --only-binary=:all: --find-links "$wheels" "node-health-agent${extras:+[$extras]}"
    ;;
*)
    echo "usage: wheels.sh build SRC WHEELS [EXTRAS] | install WHEELS [EXTRAS]" >&2
    exit 2
    ;;
esac
