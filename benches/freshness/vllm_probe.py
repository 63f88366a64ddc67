"""Publishes the freshness bench's probe blocks through vLLM's own publisher.

Run by benches/freshness.rs, never by hand. Loads vLLM's released
`vllm/distributed/kv_events.py` (extracted from a wheel by
benches/freshness/vllm_env.sh) with the stand-ins for its other imports
that scripts/capture_wire_fixtures.py keeps, and starts one
`ZmqEventPublisher` per indexer under test, each bound on a loopback port.

Protocol on stdin/stdout, one line each:
  -> (startup)                 <- "ready ENDPOINT [ENDPOINT ...]"
  -> "probe I HASH T1 .. Tn"   <- "T0_NS": the CLOCK_MONOTONIC time taken
                                  just before publisher I's `publish` of one
                                  BlockStored (block HASH, tokens T1..Tn,
                                  no parent, medium GPU)
  -> "quit"
"""

import argparse
import os
import sys
import tempfile
import time

import zmq  # noqa: F401  (the publisher module needs it importable)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module-root", required=True, help="directory holding vllm/distributed/kv_events.py")
    ap.add_argument("--scripts", required=True, help="the repository's scripts/ directory")
    ap.add_argument("--publishers", type=int, required=True)
    args = ap.parse_args()

    sys.path.insert(0, args.scripts)
    from capture_wire_fixtures import load_module  # the stand-ins live there

    mod = load_module(args.module_root, "vllm/distributed/kv_events.py", tempfile.mkdtemp(prefix="kvi-fresh-"))
    publishers, endpoints = [], []
    for _ in range(args.publishers):
        # A `*` makes vLLM bind (it connects to anything else); the port is
        # the kernel's choice, read back from the socket.
        p = mod.ZmqEventPublisher(data_parallel_rank=0, endpoint="tcp://127.0.0.1:*")
        publishers.append(p)
        endpoints.append(p._pub.getsockopt_string(zmq.LAST_ENDPOINT))
    print("ready " + " ".join(endpoints), flush=True)

    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] != "probe":
            raise SystemExit(f"unknown command {line!r}")
        index, block_hash = int(words[1]), int(words[2])
        tokens = [int(t) for t in words[3:]]
        event = mod.BlockStored(
            block_hashes=[block_hash],
            parent_block_hash=None,
            token_ids=tokens,
            block_size=len(tokens),
            lora_id=None,
            medium="GPU",
            lora_name=None,
        )
        batch = mod.KVEventBatch(ts=time.time(), events=[event])
        t0 = time.monotonic_ns()
        publishers[index].publish(batch)
        print(t0, flush=True)
    for p in publishers:
        p.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
