#!/usr/bin/env bash
# Captures the exact ZMQ frames that released vLLM and SGLang KV-event
# publishers put on the wire, into tests/fixtures/wire/.
#
# For each engine version below it downloads the wheel (no dependencies),
# extracts only the KV-event publisher module, runs it under a throwaway venv
# holding msgspec + pyzmq and tiny stand-ins for the module's other imports,
# publishes a scripted set of events over loopback TCP, and records what a SUB
# socket receives plus the replies of the replay ROUTER. Nothing of the
# engines is written into the repository: only the captured bytes and a JSON
# sidecar per capture saying what they must decode to.
#
# Usage: scripts/capture_wire_fixtures.sh [engine==version ...]
#   WIRE_CAPTURE_DIR  scratch dir for the venv and wheels
#                     (default /tmp/kv-indexer-wire-capture, outside the repo)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${WIRE_CAPTURE_DIR:-/tmp/kv-indexer-wire-capture}"
out="$repo/tests/fixtures/wire"

# One version per released wire format (see SPEC section 2):
#   vllm 0.9.0   positional events, batch [ts, events] without a rank
#   vllm 0.11.0  positional, medium + data_parallel_rank added
#   vllm 0.23.0  positional, lora_name / extra_keys / group metadata (last positional)
#   vllm 0.25.1  tagged maps, replay replies without topic
#   vllm 0.26.0  tagged maps + locality, replay replies with topic
#   vllm 0.33.0  tagged maps + ownership / session_id / lookahead (latest)
#   sglang 0.5.16  positional (last positional)
#   sglang 0.5.20  tagged maps + cache_salt, replay replies without topic
#   sglang 0.5.22  tagged maps + lora_name, replay replies with topic
#   sglang 0.5.23  latest
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
    versions=(vllm==0.9.0 vllm==0.11.0 vllm==0.23.0 vllm==0.25.1 vllm==0.26.0 vllm==0.33.0
        sglang==0.5.16 sglang==0.5.20 sglang==0.5.22 sglang==0.5.23)
fi

mkdir -p "$work/wheels" "$out"
if [ ! -x "$work/venv/bin/python" ]; then
    python3 -m venv "$work/venv"
fi
"$work/venv/bin/pip" install --quiet --disable-pip-version-check msgspec pyzmq

for spec in "${versions[@]}"; do
    engine="${spec%%==*}"
    version="${spec##*==}"
    case "$engine" in
        vllm) module="vllm/distributed/kv_events.py" ;;
        sglang) module="sglang/srt/disaggregation/kv_events.py" ;;
        *) echo "unknown engine $engine" >&2; exit 2 ;;
    esac
    wheel="$(ls "$work/wheels/$engine-$version"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        if ! pip download --quiet --no-deps --only-binary=:all: -d "$work/wheels" "$spec"; then
            echo "SKIP $spec: wheel not available" >&2
            continue
        fi
        wheel="$(ls "$work/wheels/$engine-$version"-*.whl | head -n1)"
    fi
    src="$work/engines/$engine-$version"
    rm -rf "$src"
    mkdir -p "$src"
    unzip -q -o "$wheel" "$module" -d "$src"
    for rank in 0 3; do
        "$work/venv/bin/python" "$repo/scripts/capture_wire_fixtures.py" \
            --engine "$engine" --version "$version" --wheel "$wheel" \
            --module-root "$src" --module "$module" --rank "$rank" --out "$out"
    done
done
