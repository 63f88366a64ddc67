"""Runs one released KV-event publisher as an engine for tests/engines_real.rs.

Loads the publisher module extracted from an engine's wheel, with the
stand-ins capture_wire_fixtures.py writes for its other imports, binds its
PUB and replay ROUTER sockets on the given ipc:// endpoints (no network
interface is used), publishes a fixed history (chains stored, leaves
evicted, a clear), waits until a SUB socket of its own has seen every batch
(so the engine's ring holds them all), prints one JSON line saying what the
engine now holds, and idles until its stdin closes.

Output: {"batches": n, "block_size": 16, "held": [[hash, parent, [tokens]], ...]}
with hashes as u64 (SGLang's signed hashes in two's complement).
"""

import argparse
import inspect
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture_wire_fixtures as cap  # noqa: E402  (its stand-ins and loader)

import zmq  # noqa: E402

BLOCK_SIZE = 16
ROOTS = 12
RECV_TIMEOUT_MS = 10_000


def history(first):
    """Batches of ("stored", hashes, parent, tokens) / ("removed", hashes) /
    ("cleared",): chains of up to four blocks, their leaves evicted now and
    then, one clear early on (a fill must apply it, not skip it). `first`
    sets the hashes and tokens, so a restarted engine can hold other blocks."""
    batches, next_hash, token = [], first, first

    def fresh(n):
        nonlocal next_hash, token
        hashes = [(next_hash + i) * 0x9E3779B97F4A7C15 % (1 << 64) for i in range(n)]
        next_hash += n
        tokens = list(range(token, token + n * BLOCK_SIZE))
        token += n * BLOCK_SIZE
        return hashes, tokens

    for root in range(ROOTS):
        hashes, tokens = fresh(2)
        batches.append([("stored", hashes, None, tokens)])
        child, child_tokens = fresh(2)
        batches.append([("stored", child, hashes[-1], child_tokens)])
        if root % 3 == 2:
            batches.append([("removed", [child[-1]])])
        if root == 3:
            batches.append([("cleared",)])
    return batches


def main():
    ap = argparse.ArgumentParser()
    for name in ("engine", "module-root", "module", "endpoint", "replay-endpoint"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--first", type=int, default=1_000, help="first hash seed and token id of the history")
    args = ap.parse_args()

    scratch = tempfile.mkdtemp(prefix="kv-real-engine-")
    mod = cap.load_module(args.module_root, args.module, scratch)
    signed = args.engine == "sglang"  # SGLang hashes are int64

    def wire(h):
        return h - (1 << 64) if signed and h >= (1 << 63) else h

    medium = getattr(mod, "StorageMedium", None)
    gpu = medium.GPU if medium is not None else "GPU"
    params = set(inspect.signature(mod.ZmqEventPublisher.__init__).parameters)
    kwargs = {"endpoint": args.endpoint, "replay_endpoint": args.replay_endpoint, "topic": ""}
    for rank_param in ("data_parallel_rank", "attn_dp_rank"):
        if rank_param in params:
            kwargs[rank_param] = 0
    publisher = mod.ZmqEventPublisher(**kwargs)

    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(args.endpoint)
    time.sleep(0.5)  # let the subscription reach the PUB socket

    held = {}  # hash -> (parent, tokens)
    batches = history(args.first)
    for i, batch in enumerate(batches):
        events = []
        for ev in batch:
            if ev[0] == "stored":
                _, hashes, parent, tokens = ev
                event, _ = cap.make(
                    mod.BlockStored,
                    block_hashes=[wire(h) for h in hashes],
                    parent_block_hash=None if parent is None else wire(parent),
                    token_ids=tokens,
                    block_size=BLOCK_SIZE,
                    lora_id=None,
                    lora_name=None,
                    medium=gpu,
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                )
                for j, h in enumerate(hashes):
                    held[h] = (parent if j == 0 else hashes[j - 1], tokens[j * BLOCK_SIZE:(j + 1) * BLOCK_SIZE])
            elif ev[0] == "removed":
                event, _ = cap.make(mod.BlockRemoved, block_hashes=[wire(h) for h in ev[1]], medium=gpu)
                for h in ev[1]:
                    held.pop(h, None)
            else:
                event, _ = cap.make(mod.AllBlocksCleared)
                held.clear()
            events.append(event)
        publisher.publish(mod.KVEventBatch(ts=1_700_000_000.0 + i, events=events))

    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    for seen in range(len(batches)):
        if not poller.poll(RECV_TIMEOUT_MS):
            raise SystemExit(f"the publisher sent {seen} of {len(batches)} batches")
        sub.recv_multipart()
    sub.close(linger=0)

    out = {
        "batches": len(batches),
        "block_size": BLOCK_SIZE,
        "held": [[h, p, t] for h, (p, t) in sorted(held.items())],
    }
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # idle until the test closes our stdin
    publisher.shutdown()


if __name__ == "__main__":
    main()
