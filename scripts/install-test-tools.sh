#!/usr/bin/env bash
# Fetches two tools some tests use from Debian's packages, unpacked into
# target/test-tools/ rather than installed, so nothing on the machine changes
# and no service starts:
#   systemd-nspawn  (systemd-container, the version of the installed systemd,
#                    whose shared library it links): tests/systemd_unit.rs
#                    boots the shipped unit under systemd in a container
#   promtool        (prometheus): tests/metrics_lint.rs runs
#                    `promtool check metrics` on /metrics
# and, into target/test-tools/engines/, the released KV-event publishers
# tests/engines_real.rs runs (scripts/real_engine.py): vLLM's and SGLang's
# kv_events module, each unpacked from its wheel (`pip download --no-deps`;
# the wheel is deleted once the module is out), and a venv holding msgspec
# and pyzmq to run them.
# A tool that cannot be had is reported and its test skips, saying why; the
# metrics test still runs its own lint. Safe to run again: present tools are kept.
set -uo pipefail
cd "$(dirname "$0")/.."
dest="$PWD/target/test-tools"
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"

# fetch PACKAGE[=VERSION] PATH_IN_PACKAGE NAME
fetch() {
    local pkg=$1 path=$2 name=$3
    if [ -x "$dest/$name" ]; then
        return 0
    fi
    rm -rf "${work:?}"/*
    if ! (cd "$work" && apt-get download -qq "$pkg" >/dev/null 2>&1); then
        # The package lists may be missing or stale on a new machine.
        apt-get update -qq >/dev/null 2>&1 || true
        if ! (cd "$work" && apt-get download -qq "$pkg" >/dev/null 2>&1); then
            echo "install-test-tools: cannot download $pkg; its test will skip" >&2
            return 1
        fi
    fi
    dpkg-deb -x "$work"/*.deb "$work/x" && install -m 0755 "$work/x/$path" "$dest/$name" \
        && echo "install-test-tools: $name from $pkg"
}

# engine PACKAGE==VERSION MODULE_PATH: the engine's publisher module, unpacked.
engine() {
    local spec=$1 module=$2 name=${1%%==*}
    local dir="$dest/engines"
    if [ -f "$dir/$name/$module" ]; then
        return 0
    fi
    rm -rf "${work:?}"/*
    if ! "$dir/venv/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$work" "$spec" >/dev/null 2>&1; then
        echo "install-test-tools: cannot download $spec; tests/engines_real.rs will skip" >&2
        return 1
    fi
    "$dir/venv/bin/python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
        "$work"/*.whl "$module" "$dir/$name" && echo "install-test-tools: $module from $spec"
}

engines() {
    local dir="$dest/engines"
    if [ ! -x "$dir/venv/bin/python" ]; then
        if ! python3 -m venv "$dir/venv" >/dev/null 2>&1 \
            || ! "$dir/venv/bin/pip" install --quiet --disable-pip-version-check msgspec pyzmq >/dev/null 2>&1; then
            rm -rf "$dir/venv"
            echo "install-test-tools: no python3 venv with msgspec and pyzmq; tests/engines_real.rs will skip" >&2
            return 1
        fi
        echo "install-test-tools: a venv with msgspec and pyzmq"
    fi
    # The latest of each engine's wire formats (see scripts/capture_wire_fixtures.sh).
    engine vllm==0.33.0 vllm/distributed/kv_events.py
    engine sglang==0.5.23 sglang/srt/disaggregation/kv_events.py
}
engines

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    echo "install-test-tools: no apt-get/dpkg-deb here; the tests that need systemd-nspawn and promtool will skip" >&2
    exit 0
fi
if systemd_version=$(dpkg-query -W -f='${Version}' systemd 2>/dev/null) && [ -n "$systemd_version" ]; then
    fetch "systemd-container=$systemd_version" usr/bin/systemd-nspawn systemd-nspawn
else
    echo "install-test-tools: systemd is not installed; tests/systemd_unit.rs will skip" >&2
fi
fetch prometheus usr/bin/promtool promtool
exit 0
