#!/usr/bin/env bash
# Prepares what `cargo bench --bench freshness -- --vllm DIR` needs to
# publish its probes through a released vLLM's own KV-event publisher: a
# throwaway venv with msgspec and pyzmq, and vLLM's
# vllm/distributed/kv_events.py extracted from its wheel (downloaded without
# dependencies, nothing else of vLLM installed). Everything goes to DIR,
# outside the repository; nothing of vLLM is ever committed.
#
# Usage: benches/freshness/vllm_env.sh [DIR] [VERSION]
#   DIR      default /tmp/kv-indexer-vllm
#   VERSION  default 0.33.0 (tagged-map events, the latest wire format)
set -euo pipefail

dir="${1:-/tmp/kv-indexer-vllm}"
version="${2:-0.33.0}"
module="vllm/distributed/kv_events.py"

mkdir -p "$dir/wheels"
if [ ! -x "$dir/venv/bin/python" ]; then
    python3 -m venv "$dir/venv"
fi
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check msgspec pyzmq
wheel="$(ls "$dir/wheels/vllm-$version"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
    pip download --quiet --no-deps --only-binary=:all: -d "$dir/wheels" "vllm==$version"
    wheel="$(ls "$dir/wheels/vllm-$version"-*.whl | head -n1)"
fi
rm -rf "$dir/src"
mkdir -p "$dir/src"
unzip -q -o "$wheel" "$module" -d "$dir/src"
echo "vllm $version ready in $dir (python $dir/venv/bin/python, module root $dir/src)"
