#!/bin/sh
# The image's two install steps. daemonset/Dockerfile runs them, and
# tests/test_image_install.py runs them without Docker (the second with
# CC=/bin/false, as in the runtime stage, which has no compiler).
#
#   wheels.sh build SRC WHEELS [EXTRAS]   every wheel the agent needs, into WHEELS:
#                                         its own, prebuilt (the manylinux wheel of
#                                         build_backend/release_wheel.py, from
#                                         $AGENT_DIST, default SRC/dist: nothing of
#                                         Rust is compiled here), and each dependency
#                                         at its pin in constraints.txt, C extensions
#                                         (python-iptables) compiled here
#   wheels.sh install WHEELS [EXTRAS]     the agent from WHEELS alone: no index, no source
#
# PYTHON names the interpreter (default python3).
set -eu
py=${PYTHON:-python3}
case "${1:-}" in
build)
    src=$2 out=$3 extras=${4:-}
    dist=${AGENT_DIST:-$src/dist} pins="$src/daemonset/constraints.txt"
    set -- "$dist"/node_health_agent-*-manylinux_*.whl
    if [ $# -ne 1 ] || [ ! -f "$1" ]; then
        echo "wheels.sh: expected one prebuilt agent wheel (node_health_agent-*-manylinux_*.whl) in $dist:" \
            "build it first with: python build_backend/release_wheel.py --out dist" >&2
        exit 2
    fi
    mkdir -p "$out" && cp "$1" "$out/"
    agent="$out/${1##*/}"
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
