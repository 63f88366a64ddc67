"""Writes the wire fixtures of TensorRT-LLM's streaming KV-event publisher.

TensorRT-LLM's wheels cannot be fetched here, so unlike
capture_wire_fixtures.sh this does not run the engine's module: it encodes
what that publisher sends, as read from its public source
(tensorrt_llm/_torch/pyexecutor/kv_cache_events.py, 2026-07, commit
13599e98c71c6903a2d1a240d23be002c2109821):

- live messages [topic, seq (u64 big-endian, from 0), payload], the payload a
  msgspec array [ts, events, data_parallel_rank];
- events as msgspec tagged maps ({"type": ...} first, then the fields in
  declaration order, fields at their default omitted): BlockStored with
  block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name always, mm_keys when multimodal keys are on; BlockRemoved with
  block_hashes, medium; AllBlocksCleared;
- hashes as signed 64-bit ints (the first 8 bytes of the block key, two's
  complement); medium always "GPU"; lora_name always nil;
- a multimodal item as its hex digest (a string token) then
  mm_token_id_offset + k at its k-th embedding token, and per block mm_keys
  [{"type": "mm_key", "hash", "start_offset", "uuid"?}];
- replay: a DEALER sends [b"", start_seq]; the ROUTER answers
  [b"", topic, seq, payload] per buffered batch with seq >= start_seq, then
  [b"", b"", -1 as 8 signed big-endian bytes, b""];
- rank r binds base_port + r (inproc/ipc: a "_dp<r>" suffix).

The frames go through real ZMQ sockets (inproc) so their framing is what a
subscriber receives. Output in tests/fixtures/wire/, as
capture_wire_fixtures.py describes: trtllm-2026.07-r<rank>.bin and .json.

Usage: python3 scripts/trtllm_wire_fixtures.py  (needs msgspec and pyzmq)
"""

import hashlib
import json
import os
import platform
import struct
import time

import msgspec
import zmq

VERSION = "2026.07"
SOURCE_COMMIT = "13599e98c71c6903a2d1a240d23be002c2109821"
BLOCK = 16
MM_OFFSET = 200_000
REPLAY_START_SEQ = 2
U64 = (1 << 64) - 1
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "wire")


class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class MmKey(msgspec.Struct, omit_defaults=True, tag="mm_key"):
    hash: str
    start_offset: int
    uuid: str | None = None


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int | str]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    mm_keys: list[list[MmKey]] | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None


class AllBlocksCleared(Event):
    pass


def signed(h):
    return h - (1 << 64) if h >= 1 << 63 else h


def digest(name):
    return hashlib.sha256(b"item:" + name.encode()).hexdigest()


def pad(uuid):
    """A router's pad token for an item named by a 64-digit hex uuid."""
    return 1_000_000 + (int(uuid[:16], 16) & ((1 << 30) - 1))


class Item:
    def __init__(self, name, uuid=True):
        self.digest = digest(name)
        self.uuid = digest("uuid:" + name) if uuid else None
        self.k = 0  # next embedding token


def mm_blocks(parts):
    """parts: text ints, or (item, n) for the item's next n embedding tokens.
    Returns (token_ids, mm_keys per block, router tokens per block or None)."""
    tokens, owner = [], []
    for part in parts:
        if isinstance(part, int):
            tokens.append(part)
            owner.append(None)
            continue
        item, n = part
        for _ in range(n):
            tokens.append(item.digest if item.k == 0 else MM_OFFSET + item.k)
            owner.append((item, item.k))
            item.k += 1
    assert len(tokens) % BLOCK == 0
    keys, router = [], []
    for b in range(0, len(tokens), BLOCK):
        block_keys, routed, in_run, known = [], [], False, True
        for t, o in zip(tokens[b:b + BLOCK], owner[b:b + BLOCK]):
            if o is None:
                in_run = False
                routed.append(t)
                continue
            item, k = o
            if k == 0 or not in_run:
                block_keys.append(MmKey(hash=item.digest, start_offset=k, uuid=item.uuid))
            in_run = True
            known &= item.uuid is not None
            routed.append(pad(item.uuid) if item.uuid else 0)
        keys.append(block_keys)
        router.append(routed if known else None)
    return tokens, keys, router


def scenario():
    h = lambda n: (0x9E3779B97F4A7C15 * n) & U64  # about half of them >= 2^63
    stored = lambda **kw: BlockStored(block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None, **kw)
    chain = [h(1), h(2)]
    child = [h(3)]
    a, b, c = Item("photo-a"), Item("clip-b"), Item("photo-c", uuid=False)
    mm_tokens, mm_keys, mm_router = mm_blocks(
        list(range(49, 53)) + [(a, 12), (a, 8), 53, 54, (b, 6), (b, 4)] + list(range(55, 67)))
    mm = [h(4), h(5), h(6)]
    anon_tokens, anon_keys, anon_router = mm_blocks([70, (c, 15)] + list(range(71, 87)))
    anon = [h(7), h(8)]
    batches = [
        [stored(block_hashes=[signed(x) for x in chain], parent_block_hash=None,
                token_ids=list(range(1, 33)), mm_keys=[[], []])],
        [stored(block_hashes=[signed(x) for x in child], parent_block_hash=signed(chain[-1]),
                token_ids=list(range(33, 49)), mm_keys=[[]])],
        [stored(block_hashes=[signed(x) for x in mm], parent_block_hash=signed(child[-1]),
                token_ids=mm_tokens, mm_keys=mm_keys)],
        [stored(block_hashes=[signed(x) for x in anon], parent_block_hash=None,
                token_ids=anon_tokens, mm_keys=anon_keys),
         BlockRemoved(block_hashes=[signed(child[0]), signed(mm[-1])], medium="GPU")],
        [BlockRemoved(block_hashes=[signed(anon[-1])], medium="GPU")],
        [AllBlocksCleared()],
    ]
    router = [{"block_hashes": mm, "tokens": mm_router}, {"block_hashes": anon, "tokens": anon_router}]
    return batches, router


def expected(event):
    """The event as the decoder must report it (tests/wire_fixtures.rs)."""
    if isinstance(event, AllBlocksCleared):
        return {"type": "cleared"}
    hashes = [x & U64 for x in event.block_hashes]
    if isinstance(event, BlockRemoved):
        return {"type": "removed", "block_hashes": hashes, "medium": event.medium,
                "group_idx": None, "locality": None, "ownership": None}
    out = {
        "type": "stored", "block_hashes": hashes,
        "parent_block_hash": None if event.parent_block_hash is None else event.parent_block_hash & U64,
        "token_ids": [t if isinstance(t, int) else 0 for t in event.token_ids],
        "block_size": event.block_size, "lora_id": None, "lora_name": None, "medium": event.medium,
        "cache_salt": None, "extra_keys_salt": None, "block_mm_hashes": [], "opaque_extra_keys_from": None,
        "group_idx": None, "kv_cache_spec_kind": None, "locality": None, "ownership": None,
        "multimodal": {
            "string_tokens": [[i, t] for i, t in enumerate(event.token_ids) if isinstance(t, str)],
            "mm_keys": [[{"hash": k.hash, "start_offset": k.start_offset, "uuid": k.uuid} for k in block]
                        for block in event.mm_keys],
        },
    }
    return out


def recv(sock, count):
    out = []
    while len(out) < count:
        if not sock.poll(5000):
            raise SystemExit(f"timed out after {len(out)} of {count} messages")
        out.append(sock.recv_multipart())
    return out


def capture(rank):
    topic = b"" if rank == 0 else b"kv-events"
    ctx = zmq.Context.instance()
    suffix = "" if rank == 0 else f"_dp{rank}"
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind("inproc://trtllm-kv" + suffix)
    router.bind("inproc://trtllm-replay" + suffix)
    sub, dealer = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect("inproc://trtllm-kv" + suffix)
    dealer.connect("inproc://trtllm-replay" + suffix)
    time.sleep(0.3)  # let the subscription reach the PUB socket

    encoder = msgspec.msgpack.Encoder()
    batches, router_tokens = scenario()
    ring, sidecar_live = [], []
    for seq, events in enumerate(batches):
        ts = 1_700_000_000.0 + 0.25 * seq
        payload = encoder.encode(Batch(ts=ts, events=events, data_parallel_rank=rank))
        pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        ring.append((seq, payload))
        sidecar_live.append({"seq": seq, "ts": ts, "dp_rank": rank,
                             "events": [expected(e) for e in events]})
    live = recv(sub, len(batches))

    dealer.send_multipart([b"", REPLAY_START_SEQ.to_bytes(8, "big")])
    client, empty, start = router.recv_multipart()
    start = int.from_bytes(start, "big")
    for seq, payload in ring:
        if seq >= start:
            router.send_multipart([client, b"", topic, seq.to_bytes(8, "big"), payload])
    router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
    replies = recv(dealer, len(ring) - start + 1)
    for s in (pub, router, sub, dealer):
        s.close(linger=0)

    stem = f"trtllm-{VERSION}-r{rank}"
    with open(os.path.join(OUT, stem + ".bin"), "wb") as f:
        f.write(b"KVWIRE01" + struct.pack("<II", len(live), len(replies)))
        for msg in live + replies:
            f.write(struct.pack("<I", len(msg)))
            for frame in msg:
                f.write(struct.pack("<I", len(frame)) + frame)
    sidecar = {
        "engine": "trtllm",
        "version": VERSION,
        "module": "tensorrt_llm/_torch/pyexecutor/kv_cache_events.py",
        "source_commit": SOURCE_COMMIT,
        "generated_by": "scripts/trtllm_wire_fixtures.py (the format re-encoded, no engine code run)",
        "msgspec": msgspec.__version__,
        "pyzmq": zmq.__version__,
        "python": platform.python_version(),
        "dp_rank": rank,
        "topic": topic.decode(),
        "hash_form": "signed",
        "block_size": BLOCK,
        "mm_token_id_offset": MM_OFFSET,
        # Per multimodal store, the tokens a router hashes for each block
        # (null: the item has no uuid, so no router can name it).
        "router_tokens": router_tokens,
        "live": sidecar_live,
        "replay": {
            "start_seq": REPLAY_START_SEQ,
            "frames_per_reply": len(replies[0]),
            "seqs": [seq for seq, _ in ring[REPLAY_START_SEQ:]],
        },
    }
    with open(os.path.join(OUT, stem + ".json"), "w") as f:
        json.dump(sidecar, f, indent=1)
        f.write("\n")
    print(f"wrote {stem}: {len(live)} live, {len(replies)} replay messages")


if __name__ == "__main__":
    for rank in (0, 2):
        capture(rank)
