"""Runs one released KV-event publisher module and records its frames.

Called by capture_wire_fixtures.sh with the path of a module extracted from an
engine wheel. The module's own imports besides msgspec and zmq are replaced by
small stand-ins written into a scratch package tree, so nothing else of the
engine is needed. The publisher binds its PUB and replay ROUTER sockets on
inproc endpoints and this process connects a SUB and a DEALER to them, so the
frames are exactly what the engine sends and no network interface is used.

Output, per capture, in --out:
  <engine>-<version>-r<rank>.bin   the frames, in this layout (little endian):
      b"KVWIRE01", u32 live_count, u32 replay_count,
      then live_count + replay_count messages, each:
      u32 frame_count, then per frame: u32 length, bytes
  <engine>-<version>-r<rank>.json  what the engine was asked to publish,
      normalised the way a decoder must report it (hashes as u64).
"""

import argparse
import hashlib
import importlib
import inspect
import json
import os
import platform
import shutil
import struct
import sys
import tempfile
import time

import msgspec
import zmq

U64_MASK = (1 << 64) - 1
SALT_TAG = "dynamo-cache-salt:"
REPLAY_START_SEQ = 2
RECV_TIMEOUT_MS = 5000

STUBS = {
    # vLLM
    "vllm/__init__.py": "",
    "vllm/distributed/__init__.py": "",
    "vllm/config/__init__.py": (
        "class KVEventsConfig:\n"
        "    def __init__(self, **kwargs):\n"
        "        self.__dict__.update(kwargs)\n"
    ),
    "vllm/config/kv_events.py": "from vllm.config import KVEventsConfig\n",
    "vllm/logger.py": (
        "import logging\n"
        "def init_logger(name):\n"
        "    return logging.getLogger(name)\n"
    ),
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/kv_cache_utils.py": "from typing import Union\nExternalBlockHash = Union[bytes, int]\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/network_utils.py": (
        "def get_ip():\n    return '127.0.0.1'\n"
        "def get_tcp_uri(ip, port):\n    return f'tcp://{ip}:{port}'\n"
        "def is_valid_ipv6_address(ip):\n    return False\n"
        "def split_zmq_path(path):\n"
        "    scheme, rest = path.split('://', 1)\n"
        "    host, _, port = rest.rpartition(':')\n"
        "    return scheme, host, port\n"
    ),
    # SGLang
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/disaggregation/__init__.py": "",
    "sglang/srt/utils/__init__.py": "",
    "sglang/srt/utils/network.py": (
        "class NetworkAddress:\n"
        "    def __init__(self, host, port):\n"
        "        self.host, self.port, self.is_ipv6 = host, port, False\n"
        "    @classmethod\n"
        "    def parse(cls, text):\n"
        "        host, _, port = text.rpartition(':')\n"
        "        return cls(host, int(port))\n"
        "    def to_tcp(self):\n"
        "        return f'tcp://{self.host}:{self.port}'\n"
    ),
    "sglang/srt/runtime_context.py": (
        "def get_parallel():\n    raise RuntimeError('not used by the publisher')\n"
    ),
    "pydantic/__init__.py": "class BaseModel:\n    pass\n",
}


def load_module(module_root, module_path, scratch):
    for rel, text in STUBS.items():
        path = os.path.join(scratch, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    target = os.path.join(scratch, module_path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(os.path.join(module_root, module_path), target)
    sys.path.insert(0, scratch)
    name = module_path[: -len(".py")].replace("/", ".")
    return importlib.import_module(name)


def fields_of(cls):
    return set(getattr(cls, "__struct_fields__", ()))


def make(cls, **wanted):
    """Builds an event with the fields this version has; returns (event, sent)."""
    have = fields_of(cls)
    sent = {k: v for k, v in wanted.items() if k in have}
    return cls(**sent), sent


def wire_hash(value, form):
    """An engine hash (given as u64) in the form this capture publishes."""
    if form == "bytes":
        return hashlib.sha256(value.to_bytes(8, "big")).digest()[:24] + value.to_bytes(8, "big")
    if form == "signed":
        return value - (1 << 64) if value >= (1 << 63) else value
    return value


def norm_hash(value):
    if value is None:
        return None
    if isinstance(value, bytes):
        return int.from_bytes(value[-8:], "big")
    return value & U64_MASK


def is_marked_mm(text):
    return (
        isinstance(text, str)
        and len(text) == 64
        and all(c in "0123456789abcdefABCDEF" for c in text[:16])
        and set(text[16:]) == {"0"}
    )


def classify_extra_keys(extra_keys, lora_name):
    """Salt, per-block sorted multimodal hashes and the first block carrying a
    key that cannot be reproduced from tokens, per the rules the decoder follows."""
    salt, blocks, opaque_from = None, [], None
    for i, keys in enumerate(extra_keys or []):
        hashes = []
        lora_pending = lora_name or None
        for item in keys or ():
            if isinstance(item, str) and lora_pending is not None and item == lora_pending:
                lora_pending = None
                continue
            if isinstance(item, str) and item.startswith(SALT_TAG):
                if i == 0 and salt is None and len(item) > len(SALT_TAG):
                    salt = item[len(SALT_TAG):]
                continue
            text = item
            if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], int):
                text = item[0]
            if is_marked_mm(text):
                hashes.append(int(text[:16], 16))
                continue
            if opaque_from is None:
                opaque_from = i
        blocks.append(sorted(hashes))
    if not any(blocks):
        blocks = []
    return salt, blocks, opaque_from


def str_or_none(value):
    if value is None:
        return None
    return getattr(value, "value", value)


def expected_event(kind, sent):
    if kind == "stored":
        salt, mm, opaque_from = classify_extra_keys(sent.get("extra_keys"), sent.get("lora_name"))
        return {
            "type": "stored",
            "block_hashes": [norm_hash(h) for h in sent["block_hashes"]],
            "parent_block_hash": norm_hash(sent.get("parent_block_hash")),
            "token_ids": list(sent["token_ids"]),
            "block_size": sent["block_size"],
            "lora_id": sent.get("lora_id"),
            "lora_name": sent.get("lora_name"),
            "medium": str_or_none(sent.get("medium")),
            "cache_salt": sent.get("cache_salt"),
            "extra_keys_salt": salt,
            "block_mm_hashes": mm,
            "opaque_extra_keys_from": opaque_from,
            "group_idx": sent.get("group_idx"),
            "kv_cache_spec_kind": sent.get("kv_cache_spec_kind"),
            "locality": sent.get("locality"),
            "ownership": sent.get("ownership"),
        }
    if kind == "removed":
        return {
            "type": "removed",
            "block_hashes": [norm_hash(h) for h in sent["block_hashes"]],
            "medium": str_or_none(sent.get("medium")),
            "group_idx": sent.get("group_idx"),
            "locality": sent.get("locality"),
            "ownership": sent.get("ownership"),
        }
    return {"type": "cleared"}


def scenario(mod, engine, form):
    """The batches to publish: a list of (ts, [(kind, event, sent)])."""
    stored_cls, removed_cls, cleared_cls = mod.BlockStored, mod.BlockRemoved, mod.AllBlocksCleared
    stored_fields = fields_of(stored_cls)
    medium_enum = getattr(mod, "StorageMedium", None)

    def medium(name):
        if medium_enum is not None:
            return {"GPU": medium_enum.GPU, "CPU": medium_enum.CPU, "DISK": medium_enum.DISK}[name]
        return name

    def h(value):
        return wire_hash(value, form)

    def stored(**kw):
        kw.setdefault("lora_id", None)
        kw.setdefault("lora_name", None)
        kw.setdefault("medium", medium("GPU"))
        for key in ("block_hashes",):
            kw[key] = [h(v) for v in kw[key]]
        if kw.get("parent_block_hash") is not None:
            kw["parent_block_hash"] = h(kw["parent_block_hash"])
        else:
            kw["parent_block_hash"] = None
        event, sent = make(stored_cls, **kw)
        return ("stored", event, sent)

    def removed(**kw):
        kw["block_hashes"] = [h(v) for v in kw["block_hashes"]]
        kw.setdefault("medium", medium("GPU"))
        event, sent = make(removed_cls, **kw)
        return ("removed", event, sent)

    def cleared():
        event, sent = make(cleared_cls)
        return ("cleared", event, sent)

    tokens = lambda a, b: list(range(a, b + 1))  # noqa: E731
    group = {"group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    salted = {"cache_salt": "tenant-1"} if "cache_salt" in stored_fields else {}
    batches = []
    # Plain chain of two blocks; hashes of every msgpack int width.
    batches.append([
        stored(block_hashes=[0xF00000000000AA01, 7], token_ids=tokens(1, 32), block_size=16, **group),
        stored(block_hashes=[300], parent_block_hash=7, token_ids=tokens(33, 48), block_size=16,
               lora_id=3 if engine == "vllm" else None, lora_name="adapter-a",
               extra_keys=[("adapter-a",)], **group),
    ])
    # A salted chain (SGLang field, or Dynamo's tag in vLLM extra_keys), then
    # a child in a later batch that names no salt itself in vLLM.
    batches.append([
        stored(block_hashes=[1 << 40, 1 << 63], token_ids=tokens(101, 132), block_size=16,
               extra_keys=[(SALT_TAG + "tenant-1",), None], **salted, **group),
    ])
    batches.append([
        stored(block_hashes=[U64_MASK], parent_block_hash=1 << 63, token_ids=tokens(133, 148),
               block_size=16, **salted, **group),
        stored(block_hashes=[70000], parent_block_hash=300, token_ids=tokens(49, 64), block_size=16,
               lora_name="adapter-a", extra_keys=[("adapter-a",)], **group),
    ])
    # Multimodal keys: one hash in Dynamo's marked form, one native identifier.
    batches.append([
        stored(block_hashes=[11], token_ids=tokens(201, 216), block_size=16,
               extra_keys=[(("0123456789abcdef" + "0" * 48, 4),)], **group),
        stored(block_hashes=[12], token_ids=tokens(301, 316), block_size=16,
               extra_keys=[(("9f" * 32, 0),)], **group),
    ])
    # Lower tiers and metadata the indexer must skip.
    lower = []
    if engine == "vllm":
        lower.append(stored(block_hashes=[0xF00000000000AA01], token_ids=tokens(1, 16), block_size=16,
                            medium="CPU", **group))
        lower.append(stored(block_hashes=[13], token_ids=[], block_size=0, medium="CPU", group_idx=0))
        lower.append(stored(block_hashes=[21], token_ids=tokens(1, 16), block_size=16, group_idx=1,
                            kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128))
        if "locality" in stored_fields:
            tier = "STORAGE" if hasattr(mod, "MEDIUM_STORAGE") else "FS"
            lower.append(stored(block_hashes=[22], token_ids=tokens(1, 16), block_size=16, medium=tier,
                                locality="LOCAL", **group))
            lower.append(stored(block_hashes=[23], token_ids=tokens(1, 16), block_size=16, medium="CPU",
                                locality="REMOTE", **group))
        if "ownership" in stored_fields:
            lower.append(stored(block_hashes=[24], token_ids=tokens(1, 16), block_size=16, medium="CPU",
                                ownership="kvcr", session_id="s-1", **group))
    else:
        lower.append(stored(block_hashes=[0xF00000000000AA01], token_ids=tokens(1, 16), block_size=16,
                            medium=medium("CPU")))
        lower.append(stored(block_hashes=[25], token_ids=tokens(1, 16), block_size=16,
                            medium=medium("DISK")))
        # SGLang publishes a radix node's partial last page with its own size.
        lower.append(stored(block_hashes=[26], parent_block_hash=U64_MASK, token_ids=tokens(149, 151),
                            block_size=3, **salted))
    batches.append(lower)
    batches.append([
        removed(block_hashes=[300, 70000], group_idx=0),
        removed(block_hashes=[0xF00000000000AA01], medium="CPU" if engine == "vllm" else medium("CPU")),
    ])
    batches.append([cleared()])
    return [(1_700_000_000.0 + 0.25 * i, events) for i, events in enumerate(batches)]


def recv_all(sock, count):
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    out = []
    while len(out) < count:
        if not poller.poll(RECV_TIMEOUT_MS):
            raise SystemExit(f"timed out after {len(out)} of {count} messages")
        out.append(sock.recv_multipart())
    return out


def main():
    ap = argparse.ArgumentParser()
    for name in ("engine", "version", "wheel", "module-root", "module", "out"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--rank", type=int, required=True)
    args = ap.parse_args()

    scratch = tempfile.mkdtemp(prefix="kv-wire-capture-")
    try:
        mod = load_module(args.module_root, args.module, scratch)
    except Exception as e:  # a stand-in is missing: say which import
        raise SystemExit(f"cannot import {args.module} of {args.engine} {args.version}: {e!r}")

    params = inspect.signature(mod.ZmqEventPublisher.__init__).parameters
    rank_param = next((p for p in ("data_parallel_rank", "attn_dp_rank") if p in params), None)
    if rank_param is None and args.rank != 0:
        print(f"{args.engine} {args.version}: no data-parallel rank in this version; rank {args.rank} skipped")
        return
    rank = args.rank if rank_param else 0
    topic = "" if rank == 0 else "kv-events"
    if args.engine == "sglang":
        form = "signed"  # SGLang hashes are int64 (first 8 bytes of a sha256, signed)
    elif rank != 0 and hasattr(mod, "ExternalBlockHash"):
        form = "bytes"  # vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0
    else:
        form = "int"

    # inproc: the publisher binds (its own rule for inproc endpoints) and we
    # connect in the same process, so nothing touches a network interface.
    endpoint, replay_endpoint = "inproc://kv-events", "inproc://kv-replay"
    kwargs = {"endpoint": endpoint, "replay_endpoint": replay_endpoint, "topic": topic}
    if rank_param:
        kwargs[rank_param] = rank
    publisher = mod.ZmqEventPublisher(**kwargs)
    offset = getattr(mod.ZmqEventPublisher, "offset_endpoint_port", None)
    if offset is not None:
        endpoint, replay_endpoint = offset(endpoint, rank), offset(replay_endpoint, rank)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.5)  # let the subscription reach the PUB socket

    batches = scenario(mod, args.engine, form)
    expected = []
    for ts, events in batches:
        batch = mod.KVEventBatch(ts=ts, events=[e for _, e, _ in events])
        publisher.publish(batch)
        rank_field = "data_parallel_rank" if "data_parallel_rank" in fields_of(mod.KVEventBatch) else "attn_dp_rank"
        sent_rank = getattr(batch, rank_field, None)
        expected.append({
            "ts": ts,
            "dp_rank": sent_rank,
            "events": [expected_event(kind, sent) for kind, _, sent in events],
        })
    live = recv_all(sub, len(batches))
    for i, msg in enumerate(live):
        expected[i]["seq"] = int.from_bytes(msg[1], "big")

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", REPLAY_START_SEQ.to_bytes(8, "big")])
    replies = recv_all(dealer, len(batches) - REPLAY_START_SEQ + 1)
    publisher.shutdown()
    sub.close(linger=0)
    dealer.close(linger=0)

    stem = f"{args.engine}-{args.version}-r{rank}"
    with open(os.path.join(args.out, stem + ".bin"), "wb") as f:
        f.write(b"KVWIRE01" + struct.pack("<II", len(live), len(replies)))
        for msg in live + replies:
            f.write(struct.pack("<I", len(msg)))
            for frame in msg:
                f.write(struct.pack("<I", len(frame)) + frame)
    with open(args.wheel, "rb") as f:
        wheel_sha256 = hashlib.sha256(f.read()).hexdigest()
    sidecar = {
        "engine": args.engine,
        "version": args.version,
        "wheel": os.path.basename(args.wheel),
        "wheel_sha256": wheel_sha256,
        "module": args.module,
        "msgspec": msgspec.__version__,
        "pyzmq": zmq.__version__,
        "python": platform.python_version(),
        "dp_rank": rank,
        "topic": topic,
        "hash_form": form,
        "live": expected,
        "replay": {
            "start_seq": REPLAY_START_SEQ,
            "frames_per_reply": len(replies[0]),
            "seqs": [e["seq"] for e in expected[REPLAY_START_SEQ:]],
        },
    }
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(sidecar, f, indent=1)
        f.write("\n")
    print(f"captured {stem}: {len(live)} live, {len(replies)} replay messages ({form} hashes)")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
