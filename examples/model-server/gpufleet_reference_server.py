#!/usr/bin/env python3
"""gpufleet reference model server: an OpenAI-compatible server that really computes.

A REFERENCE server for gpufleet's tests, benchmarks and `gpufleet dev` demos, NOT a product
model: its weights are random (a fixed seed), so its text is gibberish. What is real is the
serving machinery a gateway and an autoscaler react to, modelled on vLLM:

- a tiny decoder-only transformer in torch (byte-level tokens, learned positions, pre-norm
  blocks) that runs on the CPU with a paged KV cache: keys and values live in a pool of
  --num-kv-blocks blocks of --block-size tokens, addressed through each sequence's block table;
- a scheduler thread with continuous batching: up to --max-num-seqs sequences are decoded
  together, one batched forward per step, with prompts prefilled in chunks of at most
  --max-num-batched-tokens per step; the rest wait (FCFS) until a slot and KV blocks are free;
- automatic prefix caching: full prompt blocks are keyed by a chained hash (parent hash, the
  block's tokens, the LoRA adapter); a hit reuses the cached keys/values, so prefill computes
  only the new tokens and time to first token really drops; unreferenced cached blocks are
  evicted least recently used first;
- LoRA adapters (--lora-modules): random rank-8 adapters on the query and value projections,
  seeded from the adapter's name; at most --max-loras are loaded at a time, and loading one
  takes real time (materialising its weights plus --lora-load-delay, which models reading them
  from storage) while the engine waits, as vLLM's does;
- vLLM's Prometheus metric names and semantics on /metrics.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /metrics. See docs/reference-model-server.md for the flags, the metrics and the figures.

Differences from vLLM worth knowing: a request is admitted only with KV blocks for its whole
prompt plus max_tokens, so nothing is ever preempted (vLLM allocates as it goes and preempts);
the sampler only picks printable ASCII bytes and newline (one token = one character, never
end-of-sequence), so a completion ends at max_tokens or a stop string.

Needs Debian's python3-torch (run it with /usr/bin/python3). Usage:
  gpufleet_reference_server.py [--port N] [--model-name NAME] [--lora-modules a b ...] ...
"""

import argparse
import collections
import hashlib
import http.server
import json
import math
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
import uuid

torch = None  # imported by the loader thread, so /health can answer 503 while torch loads

BYTE_TOKENS = 256
BOS = 256  # start of every prompt
EOS = 257  # in the vocabulary (token prompts may use it) but never sampled
VOCAB = 258
# One token = one character of text: printable ASCII and newline.
SAMPLED_TOKENS = [10] + list(range(32, 127))
LORA_RANK = 8

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards and quantiles line up.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def log(message):
    print(f"[reference-server] {message}", file=sys.stderr, flush=True)


class RequestError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI error type."""

    def __init__(self, status, message, error_type="BadRequestError", param=None):
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.param = param


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------

class TinyDecoder:
    """A randomly initialised decoder-only transformer whose keys and values are read from and
    written to a paged pool: slot = block_table[position // block_size] * block_size + offset."""

    def __init__(self, layers, d_model, heads, max_model_len, num_slots, seed, dtype):
        if d_model % heads:
            raise ValueError(f"--d-model {d_model} is not a multiple of --heads {heads}")
        self.layers, self.d_model, self.heads = layers, d_model, heads
        self.head_dim = d_model // heads
        generator = torch.Generator().manual_seed(seed)

        def weight(*shape, std=0.02):
            return (torch.randn(*shape, generator=generator) * std).to(dtype)

        d = d_model
        # Embeddings a little larger than the blocks' weights, so greedy decoding depends on
        # the context rather than collapsing onto one character.
        self.token_embedding = weight(VOCAB, d, std=0.5)
        self.position_embedding = weight(max_model_len, d, std=0.5)
        self.blocks = []
        for _ in range(layers):
            self.blocks.append({
                "qkv": weight(d, 3 * d, std=1.0 / math.sqrt(d)),
                "out": weight(d, d, std=1.0 / math.sqrt(d)),
                "up": weight(d, 4 * d, std=1.0 / math.sqrt(d)),
                "down": weight(4 * d, d, std=1.0 / math.sqrt(4 * d)),
            })
        # Not tied to the embeddings: a tied random head mostly predicts the input token back.
        self.head = weight(len(SAMPLED_TOKENS), d, std=2.0 / math.sqrt(d))
        self.dtype = dtype
        self.key_cache = [torch.zeros(num_slots, heads, self.head_dim, dtype=dtype)
                          for _ in range(layers)]
        self.value_cache = [torch.zeros(num_slots, heads, self.head_dim, dtype=dtype)
                            for _ in range(layers)]

    def forward(self, items, lora_groups):
        """Computes the new tokens of several sequences in one batch.

        items: [(new_token_ids, start_position, slots)] where slots are the cache slots of
        positions 0 .. start+len(new)-1. lora_groups: [(adapter, sequence indices)].
        Returns the logits over SAMPLED_TOKENS at each sequence's last new token, [B, V']."""
        batch = len(items)
        width = max(len(new) for new, _, _ in items)
        context = max(start + len(new) for new, start, _ in items)
        tokens = torch.zeros(batch, width, dtype=torch.long)
        positions = torch.zeros(batch, width, dtype=torch.long)
        read_slots = torch.zeros(batch, context, dtype=torch.long)
        write_slots, write_rows, counts = [], [], []
        for row, (new, start, slots) in enumerate(items):
            count = len(new)
            tokens[row, :count] = torch.tensor(new, dtype=torch.long)
            positions[row, :count] = torch.arange(start, start + count)
            read_slots[row, :start + count] = slots[:start + count]
            write_slots.append(slots[start:start + count])
            write_rows.append(torch.arange(row * width, row * width + count))
            counts.append(count)
        write_slots = torch.cat(write_slots)
        write_rows = torch.cat(write_rows)
        # A query at position p sees keys 0..p of its own sequence: the padding keys beyond a
        # sequence's end are later than any of its queries; padding queries (position 0) see
        # key 0 only, so no row of the softmax is empty.
        mask = (torch.arange(context)[None, None, :] <= positions[:, :, None])[:, None]
        lora_rows = [(adapter, torch.cat([torch.arange(i * width, (i + 1) * width)
                                          for i in indices]))
                     for adapter, indices in lora_groups]

        d, heads, head_dim = self.d_model, self.heads, self.head_dim
        x = self.token_embedding[tokens] + self.position_embedding[positions]
        for layer, block in enumerate(self.blocks):
            h = torch.nn.functional.layer_norm(x, (d,))
            qkv = (h @ block["qkv"]).reshape(batch * width, 3 * d)
            for adapter, rows in lora_rows:
                qkv.index_add_(0, rows, adapter.delta(layer, h.reshape(batch * width, d)[rows]))
            q, k, v = qkv.split(d, dim=1)
            keys, values = self.key_cache[layer], self.value_cache[layer]
            keys[write_slots] = k[write_rows].reshape(-1, heads, head_dim)
            values[write_slots] = v[write_rows].reshape(-1, heads, head_dim)
            q = q.reshape(batch, width, heads, head_dim).transpose(1, 2)
            k_all = keys[read_slots].permute(0, 2, 3, 1)  # [B, H, hd, T]
            v_all = values[read_slots].transpose(1, 2)  # [B, H, T, hd]
            scores = (q @ k_all) / math.sqrt(head_dim)
            scores = scores.masked_fill(~mask, float("-inf"))
            attended = torch.softmax(scores, dim=-1) @ v_all
            x = x + attended.transpose(1, 2).reshape(batch, width, d) @ block["out"]
            h = torch.nn.functional.layer_norm(x, (d,))
            x = x + torch.nn.functional.gelu(h @ block["up"]) @ block["down"]
        last = x[torch.arange(batch), torch.tensor(counts) - 1]
        return (torch.nn.functional.layer_norm(last, (d,)) @ self.head.T).float()


class LoraAdapter:
    """A rank-8 update of the query and value projections of every layer: q += (h A_q) B_q."""

    def __init__(self, name, layers, d_model, load_delay, dtype):
        # Seeded from the name so every replica materialises the same adapter.
        seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1
        generator = torch.Generator().manual_seed(seed)
        self.name = name
        self.layers = []
        for _ in range(layers):
            parts = [torch.randn(d_model, LORA_RANK, generator=generator) / math.sqrt(d_model),
                     torch.randn(LORA_RANK, d_model, generator=generator) * 0.3,
                     torch.randn(d_model, LORA_RANK, generator=generator) / math.sqrt(d_model),
                     torch.randn(LORA_RANK, d_model, generator=generator) * 0.3]
            self.layers.append([part.to(dtype) for part in parts])
        time.sleep(load_delay)  # models reading the adapter's weights from storage

    def delta(self, layer, h):
        a_q, b_q, a_v, b_v = self.layers[layer]
        d = b_q.shape[1]
        update = torch.zeros(h.shape[0], 3 * d, dtype=h.dtype)
        update[:, :d] = (h @ a_q) @ b_q
        update[:, 2 * d:] = (h @ a_v) @ b_v
        return update


# --------------------------------------------------------------------------------------------
# Paged KV blocks and the prefix cache
# --------------------------------------------------------------------------------------------

class BlockPool:
    """KV blocks with reference counts. A full block may be registered under its chained hash;
    when its last user releases it, it stays cached but evictable (LRU) until it is reused by a
    prefix hit or taken for a new allocation."""

    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free = collections.deque(range(num_blocks))  # never cached or evicted
        self.refcount = [0] * num_blocks
        self.hash_of = [None] * num_blocks
        self.cached = {}  # hash -> block
        self.evictable = collections.OrderedDict()  # cached blocks nobody uses, oldest first

    def available(self):
        return len(self.free) + len(self.evictable)

    def usage(self):
        """vLLM's kv_cache_usage: the fraction of blocks that are not free (cached blocks no
        request uses count as free)."""
        return 1.0 - self.available() / self.num_blocks

    def longest_cached_prefix(self, hashes):
        blocks = []
        for block_hash in hashes:
            block = self.cached.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def can_allocate(self, hit_blocks, new_blocks):
        reclaimed = sum(1 for block in hit_blocks if block in self.evictable)
        return new_blocks <= self.available() - reclaimed

    def allocate(self, hit_blocks, new_blocks):
        for block in hit_blocks:
            if self.refcount[block] == 0:
                del self.evictable[block]
            self.refcount[block] += 1
        fresh = []
        for _ in range(new_blocks):
            if self.free:
                block = self.free.popleft()
            else:
                block, _ = self.evictable.popitem(last=False)
                del self.cached[self.hash_of[block]]
                self.hash_of[block] = None
            self.refcount[block] = 1
            fresh.append(block)
        return list(hit_blocks) + fresh

    def register(self, block, block_hash):
        if self.hash_of[block] is None and block_hash not in self.cached:
            self.cached[block_hash] = block
            self.hash_of[block] = block_hash

    def release(self, blocks):
        # Last block first, so a chain's tail is evicted before its head (as vLLM does): the
        # head is what later prompts share.
        for block in reversed(blocks):
            self.refcount[block] -= 1
            if self.refcount[block] == 0:
                if self.hash_of[block] is not None:
                    self.evictable[block] = None
                else:
                    self.free.append(block)


def chain_hash(parent, block_tokens, adapter):
    digest = hashlib.sha256(parent)
    digest.update(repr((tuple(block_tokens), adapter)).encode())
    return digest.digest()


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

class Histogram:
    def __init__(self, buckets):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value):
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self, name, labels):
        out = [f'{name}_bucket{{{labels},le="{bound}"}} {count}'
               for bound, count in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def label_value(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# --------------------------------------------------------------------------------------------
# The engine: scheduler thread with continuous batching
# --------------------------------------------------------------------------------------------

class Sequence:
    """One prompt's generation. Its events go to `events` as (index, kind, payload)."""

    def __init__(self, index, prompt_tokens, params, adapter, events):
        self.id = uuid.uuid4().hex
        self.index = index
        self.prompt_len = len(prompt_tokens)
        self.tokens = list(prompt_tokens)
        self.max_tokens = params["max_tokens"]
        self.temperature = params["temperature"]
        self.top_p = params["top_p"]
        self.top_k = params["top_k"]
        self.stop = params["stop"]
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.seed = params["seed"]
        self.adapter = adapter
        self.events = events
        self.arrival = time.monotonic()
        self.scheduled_at = None
        self.first_token_at = None
        self.last_token_at = None
        self.generator = None
        self.blocks = []
        self.slots = None
        self.prompt_hashes = []
        self.registered = 0  # leading blocks registered in the prefix cache
        self.num_computed = 0  # tokens whose keys/values are in the cache
        self.cached_tokens = 0
        self.text = ""
        self.emitted = 0
        self.aborted = False

    @property
    def generated(self):
        return len(self.tokens) - self.prompt_len


class Engine:
    def __init__(self, args, model_name):
        self.args = args
        self.model_name = model_name
        self.block_size = args.block_size
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.waiting = collections.deque()
        self.running = []
        self.pool = BlockPool(args.num_kv_blocks)
        self.lora_names = list(args.lora_modules)
        self.loaded_loras = collections.OrderedDict()  # name -> LoraAdapter, LRU first
        self.model = None
        self.thread = None
        # Metric state, read by /metrics under the lock.
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = collections.Counter()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.lora_loads = 0

    def load(self):
        global torch
        import torch as torch_module
        torch = torch_module
        torch.set_num_threads(self.args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set: fine
        args = self.args
        self.model = TinyDecoder(args.layers, args.d_model, args.heads, args.max_model_len,
                                 args.num_kv_blocks * args.block_size, args.seed,
                                 getattr(torch, args.dtype))
        self.thread = threading.Thread(target=self.run, name="scheduler", daemon=True)
        self.thread.start()

    # ---- called by HTTP handler threads ----

    def submit(self, sequences):
        with self.lock:
            self.waiting.extend(sequences)
            self.wakeup.notify()

    def abort(self, sequences):
        with self.lock:
            for sequence in sequences:
                sequence.aborted = True
            self.wakeup.notify()

    def idle(self):
        with self.lock:
            return not self.waiting and not self.running

    def blocks_needed(self, prompt_len, max_tokens):
        # The last generated token is never fed back, so its keys/values need no slot.
        return -(-(prompt_len + max_tokens - 1) // self.block_size)

    # ---- the scheduler thread ----

    def run(self):
        while True:
            try:
                self.step()
            except Exception:  # noqa: BLE001 - fail the batch, keep serving
                log("engine step failed:\n" + traceback.format_exc())
                with self.lock:
                    for sequence in self.running:
                        self.pool.release(sequence.blocks)
                        sequence.events.put((sequence.index, "error", "internal engine error"))
                    self.running = []

    def step(self):
        with self.lock:
            while not self.waiting and not self.running:
                self.wakeup.wait()
            self.drop_aborted()
            adapter_to_load = self.admit()
            prefills = [s for s in self.running if s.num_computed < s.prompt_len]
            decodes = [s for s in self.running if s.num_computed >= s.prompt_len]
        if adapter_to_load is not None:
            self.load_adapter(adapter_to_load)
            return
        budget = max(self.args.max_num_batched_tokens - len(decodes), 1)
        scheduled = []
        if decodes:
            logits = self.model.forward(
                [(s.tokens[-1:], s.num_computed, s.slots) for s in decodes],
                self.lora_groups(decodes))
            scheduled.append((decodes, [1] * len(decodes), logits))
        for sequence in prefills:
            if budget <= 0:
                break
            count = min(sequence.prompt_len - sequence.num_computed, budget)
            budget -= count
            start = sequence.num_computed
            logits = self.model.forward(
                [(sequence.tokens[start:start + count], start, sequence.slots)],
                self.lora_groups([sequence]))
            scheduled.append(([sequence], [count], logits))
        now = time.monotonic()
        with self.lock:
            for sequences, counts, logits in scheduled:
                for row, (sequence, count) in enumerate(zip(sequences, counts)):
                    sequence.num_computed += count
                    self.register_full_blocks(sequence)
                    if sequence.num_computed == len(sequence.tokens) and not sequence.aborted:
                        self.append_token(sequence, self.sample(sequence, logits[row]), now)
            self.running = [s for s in self.running if not self.finish_if_done(s, now)]

    def lora_groups(self, sequences):
        groups = collections.defaultdict(list)
        for index, sequence in enumerate(sequences):
            if sequence.adapter is not None:
                groups[sequence.adapter].append(index)
        return [(self.loaded_loras[name], indices) for name, indices in groups.items()]

    def drop_aborted(self):
        for sequence in [s for s in self.running if s.aborted]:
            self.pool.release(sequence.blocks)
            self.running.remove(sequence)
        if any(s.aborted for s in self.waiting):
            self.waiting = collections.deque(s for s in self.waiting if not s.aborted)

    def admit(self):
        """Moves waiting sequences into the running batch, first come first served. A sequence
        whose adapter cannot get a LoRA slot is skipped (it waits; later ones may go); one that
        finds too few free KV blocks stops admission. Returns an adapter to load, if any."""
        skipped = []
        adapter_to_load = None
        while self.waiting and len(self.running) < self.args.max_num_seqs:
            sequence = self.waiting[0]
            if sequence.adapter is not None and sequence.adapter not in self.loaded_loras:
                if self.lora_slot_free():
                    adapter_to_load = sequence.adapter
                    break
                skipped.append(self.waiting.popleft())
                continue
            if not self.allocate(sequence):
                break
            if sequence.adapter is not None:
                self.loaded_loras.move_to_end(sequence.adapter)
            self.waiting.popleft()
            self.running.append(sequence)
        self.waiting.extendleft(reversed(skipped))
        return adapter_to_load

    def running_adapters(self):
        return {s.adapter for s in self.running if s.adapter is not None}

    def lora_slot_free(self):
        in_use = self.running_adapters()
        return (len(self.loaded_loras) < self.args.max_loras
                or any(name not in in_use for name in self.loaded_loras))

    def load_adapter(self, name):
        started = time.monotonic()
        adapter = LoraAdapter(name, self.args.layers, self.args.d_model,
                              self.args.lora_load_delay, self.model.dtype)
        with self.lock:
            in_use = self.running_adapters()
            while len(self.loaded_loras) >= self.args.max_loras:
                victim = next(n for n in self.loaded_loras if n not in in_use)
                del self.loaded_loras[victim]
            self.loaded_loras[name] = adapter
            self.lora_loads += 1
        log(f"loaded LoRA adapter {name} in {time.monotonic() - started:.2f} s")

    def allocate(self, sequence):
        size = self.block_size
        if not sequence.prompt_hashes:
            parent = b""
            for start in range(0, sequence.prompt_len - size + 1, size):
                parent = chain_hash(parent, sequence.tokens[start:start + size],
                                    sequence.adapter)
                sequence.prompt_hashes.append(parent)
        # At least the prompt's last token is computed: its logits give the first token.
        hit = self.pool.longest_cached_prefix(
            sequence.prompt_hashes[:(sequence.prompt_len - 1) // size])
        needed = self.blocks_needed(sequence.prompt_len, sequence.max_tokens)
        if not self.pool.can_allocate(hit, needed - len(hit)):
            return False
        sequence.blocks = self.pool.allocate(hit, needed - len(hit))
        table = torch.tensor(sequence.blocks, dtype=torch.long)
        sequence.slots = (table[:, None] * size + torch.arange(size)[None, :]).reshape(-1)
        sequence.num_computed = sequence.cached_tokens = len(hit) * size
        sequence.registered = len(hit)
        sequence.scheduled_at = time.monotonic()
        if sequence.seed is not None:
            sequence.generator = torch.Generator().manual_seed(sequence.seed)
        elif sequence.temperature > 0:
            sequence.generator = torch.Generator().manual_seed(
                int.from_bytes(os.urandom(8), "little") >> 1)
        self.prefix_queries += sequence.prompt_len
        self.prefix_hits += sequence.cached_tokens
        self.queue_time.observe(sequence.scheduled_at - sequence.arrival)
        return True

    def register_full_blocks(self, sequence):
        size = self.block_size
        while (sequence.registered + 1) * size <= sequence.num_computed:
            index = sequence.registered
            if index < len(sequence.prompt_hashes):
                block_hash = sequence.prompt_hashes[index]
            else:
                parent = sequence.prompt_hashes[index - 1] if index else b""
                block_hash = chain_hash(parent, sequence.tokens[index * size:(index + 1) * size],
                                        sequence.adapter)
                sequence.prompt_hashes.append(block_hash)
            self.pool.register(sequence.blocks[index], block_hash)
            sequence.registered += 1

    def sample(self, sequence, logits):
        if sequence.temperature == 0:
            choice = int(torch.argmax(logits))
        else:
            logits = logits / sequence.temperature
            if sequence.top_k > 0:
                threshold = torch.topk(logits, min(sequence.top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < threshold, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            if sequence.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                outside = torch.cumsum(sorted_probs, 0) - sorted_probs > sequence.top_p
                sorted_probs[outside] = 0
                probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            choice = int(torch.multinomial(probs, 1, generator=sequence.generator))
        return SAMPLED_TOKENS[choice]

    def append_token(self, sequence, token, now):
        if sequence.first_token_at is None:
            sequence.first_token_at = now
            self.ttft.observe(now - sequence.arrival)
            self.prompt_tokens += sequence.prompt_len
        else:
            self.tpot.observe(now - sequence.last_token_at)
        sequence.last_token_at = now
        sequence.tokens.append(token)
        sequence.text += chr(token)
        self.generation_tokens += 1

    def finish_if_done(self, sequence, now):
        if sequence.aborted:
            self.pool.release(sequence.blocks)
            return True
        if sequence.first_token_at is None or sequence.num_computed < len(sequence.tokens) - 1:
            return False
        reason, stop_reason = None, None
        for stop in sequence.stop:
            if sequence.text.endswith(stop):
                sequence.text = sequence.text[:-len(stop)]
                reason, stop_reason = "stop", stop
                break
        if reason is None and sequence.generated >= sequence.max_tokens:
            reason = "length"
        if reason is None:
            # Text that could still turn out to begin a stop string is held back.
            safe = len(sequence.text) - sequence.hold_back
            if safe > sequence.emitted:
                sequence.events.put((sequence.index, "text", sequence.text[sequence.emitted:safe]))
                sequence.emitted = safe
            return False
        if len(sequence.text) > sequence.emitted:
            sequence.events.put((sequence.index, "text", sequence.text[sequence.emitted:]))
            sequence.emitted = len(sequence.text)
        self.pool.release(sequence.blocks)
        self.success[reason] += 1
        self.e2e.observe(now - sequence.arrival)
        sequence.events.put((sequence.index, "finish", {
            "finish_reason": reason, "stop_reason": stop_reason,
            "prompt_tokens": sequence.prompt_len, "completion_tokens": sequence.generated,
            "cached_tokens": sequence.cached_tokens}))
        return True

    # ---- metrics ----

    def metrics_text(self):
        labels = f'model_name="{label_value(self.model_name)}",engine="0"'
        with self.lock:
            running, waiting = len(self.running), len(self.waiting)
            usage = self.pool.usage()
            running_loras = ",".join(sorted(self.running_adapters()))
            waiting_loras = ",".join(sorted({s.adapter for s in self.waiting if s.adapter}))
            out = []

            def metric(name, kind, help_text, value):
                out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                            f"{name}{{{labels}}} {value}"])

            metric("vllm:num_requests_running", "gauge",
                   "Number of requests in model execution batches.", running)
            metric("vllm:num_requests_waiting", "gauge",
                   "Number of requests waiting to be processed.", waiting)
            metric("vllm:kv_cache_usage_perc", "gauge",
                   "KV-cache usage. 1 means 100 percent usage.", usage)
            metric("vllm:gpu_cache_usage_perc", "gauge",
                   "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use "
                   "vllm:kv_cache_usage_perc instead.", usage)
            metric("vllm:prefix_cache_queries_total", "counter",
                   "Prefix cache queries, in terms of number of queried tokens.",
                   self.prefix_queries)
            metric("vllm:prefix_cache_hits_total", "counter",
                   "Prefix cache hits, in terms of number of cached tokens.", self.prefix_hits)
            metric("vllm:gpu_prefix_cache_queries_total", "counter",
                   "GPU prefix cache queries, in terms of number of queried tokens. "
                   "DEPRECATED: Use vllm:prefix_cache_queries instead.", self.prefix_queries)
            metric("vllm:gpu_prefix_cache_hits_total", "counter",
                   "GPU prefix cache hits, in terms of number of cached tokens. "
                   "DEPRECATED: Use vllm:prefix_cache_hits instead.", self.prefix_hits)
            metric("vllm:num_preemptions_total", "counter",
                   "Cumulative number of preemption from the engine.", 0)
            metric("vllm:prompt_tokens_total", "counter",
                   "Number of prefill tokens processed.", self.prompt_tokens)
            metric("vllm:generation_tokens_total", "counter",
                   "Number of generation tokens processed.", self.generation_tokens)
            out += ["# HELP vllm:request_success_total Count of successfully processed requests.",
                    "# TYPE vllm:request_success_total counter"]
            for reason in ("stop", "length", "abort"):
                out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
                           f"{self.success[reason]}")
            for name, help_text, histogram in (
                    ("vllm:time_to_first_token_seconds",
                     "Histogram of time to first token in seconds.", self.ttft),
                    ("vllm:time_per_output_token_seconds",
                     "Histogram of time per output token in seconds.", self.tpot),
                    ("vllm:e2e_request_latency_seconds",
                     "Histogram of e2e request latency in seconds.", self.e2e),
                    ("vllm:request_queue_time_seconds",
                     "Histogram of time spent in WAITING phase for request.", self.queue_time)):
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
                out += histogram.lines(name, labels)
            out += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                    "# TYPE vllm:cache_config_info gauge",
                    f'vllm:cache_config_info{{block_size="{self.block_size}",'
                    f'enable_prefix_caching="True",engine="0",'
                    f'num_gpu_blocks="{self.pool.num_blocks}"}} 1.0']
            if self.lora_names:
                # vLLM sets this gauge to the time of the last update; it keeps every label
                # set it has seen, so consumers take the series with the largest value. Here
                # only the current one is exported, which those consumers read the same way.
                out += ["# HELP vllm:lora_requests_info Running stats on lora requests.",
                        "# TYPE vllm:lora_requests_info gauge",
                        f'vllm:lora_requests_info{{max_lora="{self.args.max_loras}",'
                        f'running_lora_adapters="{label_value(running_loras)}",'
                        f'waiting_lora_adapters="{label_value(waiting_loras)}"}} {time.time()}']
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Requests: validation and tokenisation
# --------------------------------------------------------------------------------------------

def encode_text(text):
    return [BOS] + list(text.encode("utf-8"))


def chat_template(messages):
    """A plain template: each message as '<|role|>\\ncontent\\n', then the assistant's turn."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of messages",
                           param="messages")
    parts = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{number}] must be an object with a 'role'",
                               param="messages")
        role = message["role"]
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise RequestError(400, f"messages[{number}] has an unknown role {role!r}",
                               param="messages")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise RequestError(400, f"messages[{number}].content: only text parts are "
                                       "supported", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{number}].content must be a string",
                               param="messages")
        parts.append(f"<|{role}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def completion_prompts(prompt):
    """The prompt(s) of a completion request as token lists: a string, a list of strings, a
    list of token ids, or a list of lists of token ids."""
    if isinstance(prompt, str):
        return [encode_text(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [encode_text(p) for p in prompt]
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [check_token_ids(prompt)]
        if all(isinstance(p, list) and p for p in prompt):
            return [check_token_ids(p) for p in prompt]
    raise RequestError(400, "'prompt' must be a string, a non-empty list of strings or a list "
                       "of token ids", param="prompt")


def check_token_ids(ids):
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < VOCAB:
            raise RequestError(400, f"token ids must be integers in [0, {VOCAB})",
                               param="prompt")
    return list(ids)


def number_field(body, name, default, low, high, integer=False):
    value = body.get(name)
    if value is None:
        return default
    wanted = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise RequestError(400, f"'{name}' must be {'an integer' if integer else 'a number'}",
                           param=name)
    if not low <= value <= high:
        raise RequestError(400, f"'{name}' must be between {low} and {high}, got {value}",
                           param=name)
    return value


def sampling_params(body, args, default_max_tokens):
    for name, allowed in (("n", (None, 1)), ("best_of", (None, 1)), ("logprobs", (None, False)),
                          ("echo", (None, False)), ("top_logprobs", (None, 0))):
        if body.get(name) not in allowed:
            raise RequestError(400, f"'{name}' is not supported by the reference server",
                               param=name)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not (
            1 <= max_tokens <= args.max_tokens_limit):
        raise RequestError(400, f"'max_tokens' must be an integer between 1 and "
                           f"{args.max_tokens_limit}", param="max_tokens")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(
            isinstance(s, str) and 0 < len(s) <= 64 for s in stop):
        raise RequestError(400, "'stop' must be a string or a list of at most 4 non-empty "
                           "strings of at most 64 characters", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "'stream_options' must be an object", param="stream_options")
    return {
        "max_tokens": max_tokens,
        "temperature": number_field(body, "temperature", 1.0, 0.0, 2.0),
        "top_p": number_field(body, "top_p", 1.0, 1e-9, 1.0),
        "top_k": number_field(body, "top_k", -1, -1, len(SAMPLED_TOKENS), integer=True),
        "seed": number_field(body, "seed", None, -(2 ** 63), 2 ** 63 - 1, integer=True),
        "stop": stop,
        "stream": stream,
        "include_usage": bool(options.get("include_usage", False)),
    }


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

class ServerState:
    def __init__(self, args, engine):
        self.args = args
        self.engine = engine
        self.ready = threading.Event()
        self.draining = threading.Event()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.created = int(time.time())

    def enter(self):
        with self.lock:
            self.in_flight += 1

    def leave(self):
        with self.lock:
            self.in_flight -= 1

    def busy(self):
        with self.lock:
            return self.in_flight > 0


class ClientGone(Exception):
    pass


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpufleet-reference-server/1"

    @property
    def state(self):
        return self.server.state

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        if self.state.args.log_requests:
            super().log_message(format, *args)

    # ---- plumbing ----

    def send_body(self, status, body, content_type="application/json", close=False):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status, value, close=False):
        self.send_body(status, json.dumps(value), close=close)

    def send_error_json(self, status, message, error_type, param=None, close=False):
        self.send_json(status, {"error": {"message": message, "type": error_type,
                                          "param": param, "code": status}}, close=close)

    def read_json(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise RequestError(411, "chunked request bodies are not supported; send "
                               "Content-Length", error_type="LengthRequiredError")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise RequestError(400, "bad Content-Length header") from None
        if length < 0:
            raise RequestError(400, "bad Content-Length header")
        if length > self.state.args.max_body_bytes:
            self.close_connection = True  # the unread body would be taken for a request
            raise RequestError(413, f"request body of {length} bytes is over the limit of "
                               f"{self.state.args.max_body_bytes}",
                               error_type="RequestTooLargeError")
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            raise RequestError(400, f"request body is not valid JSON: {error}") from None
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        return body

    def client_gone(self):
        """True once the client has closed its end (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def write_chunk(self, data):
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as error:
            raise ClientGone() from error

    def write_event(self, value):
        payload = value if isinstance(value, str) else json.dumps(value)
        self.write_chunk(f"data: {payload}\n\n".encode())

    # ---- routes ----

    def do_GET(self):  # noqa: N802 - the base class's name
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if not self.state.ready.is_set():
                self.send_body(503, "loading\n", "text/plain")
            elif self.state.draining.is_set():
                self.send_body(503, "draining\n", "text/plain")
            else:
                self.send_body(200, "", "text/plain")
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": self.model_cards()})
        elif path == "/metrics":
            if not self.state.ready.is_set():
                self.send_body(503, "loading\n", "text/plain")
            else:
                self.send_body(200, self.state.engine.metrics_text(),
                               "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.send_error_json(404, f"no route GET {path}", "NotFoundError")

    def do_POST(self):  # noqa: N802 - the base class's name
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_error_json(404, f"no route POST {path}", "NotFoundError", close=True)
            return
        self.state.enter()
        try:
            body = self.read_json()
            if self.state.draining.is_set():
                raise RequestError(503, "the server is shutting down",
                                   error_type="ServiceUnavailableError")
            if not self.state.ready.is_set():
                raise RequestError(503, "the model is still loading",
                                   error_type="ServiceUnavailableError")
            self.generate(body, chat=path == "/v1/chat/completions")
        except RequestError as error:
            self.send_error_json(error.status, str(error), error.error_type, error.param,
                                 close=error.status in (411, 413, 503))
        except ClientGone:
            self.close_connection = True
        finally:
            self.state.leave()

    def model_cards(self):
        args, engine = self.state.args, self.state.engine
        base = engine.model_name
        cards = [{"id": base, "object": "model", "created": self.state.created,
                  "owned_by": "gpufleet", "root": base, "parent": None,
                  "max_model_len": args.max_model_len, "permission": []}]
        for name in engine.lora_names:
            cards.append({"id": name, "object": "model", "created": self.state.created,
                          "owned_by": "gpufleet", "root": name, "parent": base,
                          "max_model_len": args.max_model_len, "permission": []})
        return cards

    def generate(self, body, chat):
        args, engine = self.state.args, self.state.engine
        model = body.get("model", engine.model_name)
        if not isinstance(model, str):
            raise RequestError(400, "'model' must be a string", param="model")
        if model != engine.model_name and model not in engine.lora_names:
            raise RequestError(404, f"The model `{model}` does not exist.",
                               error_type="NotFoundError", param="model")
        adapter = None if model == engine.model_name else model
        if chat:
            if "messages" not in body:
                raise RequestError(400, "'messages' is required", param="messages")
            prompts = [encode_text(chat_template(body["messages"]))]
            params = sampling_params(body, args, args.default_chat_max_tokens)
        else:
            if "prompt" not in body:
                raise RequestError(400, "'prompt' is required", param="prompt")
            prompts = completion_prompts(body["prompt"])
            if len(prompts) > args.max_num_seqs * 4:
                raise RequestError(400, f"at most {args.max_num_seqs * 4} prompts per request",
                                   param="prompt")
            params = sampling_params(body, args, 16)
        for tokens in prompts:
            if len(tokens) > args.max_prompt_tokens:
                raise RequestError(400, f"the prompt has {len(tokens)} tokens, over the limit of "
                                   f"{args.max_prompt_tokens}", param="prompt")
            total = len(tokens) + params["max_tokens"]
            if total > args.max_model_len:
                raise RequestError(400, f"This model's maximum context length is "
                                   f"{args.max_model_len} tokens. However, you requested "
                                   f"{total} tokens ({len(tokens)} in the prompt, "
                                   f"{params['max_tokens']} in the completion).",
                                   param="max_tokens")
            if engine.blocks_needed(len(tokens), params["max_tokens"]) > args.num_kv_blocks:
                raise RequestError(400, f"the request needs more KV blocks than the server has "
                                   f"({args.num_kv_blocks} of {args.block_size} tokens)",
                                   param="max_tokens")
        events = queue.Queue()
        self.last_liveness_check = time.monotonic()
        sequences = [Sequence(index, tokens, params, adapter, events)
                     for index, tokens in enumerate(prompts)]
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        engine.submit(sequences)
        try:
            if params["stream"]:
                self.stream_response(request_id, model, chat, sequences, events, params)
            else:
                self.whole_response(request_id, model, chat, sequences, events)
        finally:
            engine.abort([s for s in sequences])  # no-op for the finished ones

    def next_event(self, events):
        """The engine's next event; raises ClientGone when the client hangs up meanwhile
        (looked at every 0.1 s: a whole response writes nothing until its end)."""
        while True:
            now = time.monotonic()
            if now - self.last_liveness_check >= 0.1:
                self.last_liveness_check = now
                if self.client_gone():
                    raise ClientGone()
            try:
                return events.get(timeout=0.1)
            except queue.Empty:
                pass

    def whole_response(self, request_id, model, chat, sequences, events):
        texts = [""] * len(sequences)
        finishes = [None] * len(sequences)
        while any(f is None for f in finishes):
            index, kind, payload = self.next_event(events)
            if kind == "text":
                texts[index] += payload
            elif kind == "finish":
                finishes[index] = payload
            else:
                raise RequestError(500, payload, error_type="InternalServerError")
        choices = []
        for index, (text, finish) in enumerate(zip(texts, finishes)):
            choice = {"index": index, "logprobs": None,
                      "finish_reason": finish["finish_reason"],
                      "stop_reason": finish["stop_reason"]}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        self.send_json(200, {"id": request_id,
                             "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model, "choices": choices,
                             "usage": usage(finishes)})

    def stream_response(self, request_id, model, chat, sequences, events, params):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, usage_value=None):
            value = {"id": request_id, "object": kind, "created": created, "model": model,
                     "choices": choices}
            if params["include_usage"]:
                value["usage"] = usage_value
            self.write_event(value)

        if chat:
            for sequence in sequences:
                chunk([{"index": sequence.index, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None}])
        finishes = [None] * len(sequences)
        while any(f is None for f in finishes):
            index, event, payload = self.next_event(events)
            if event == "text":
                if chat:
                    chunk([{"index": index, "delta": {"content": payload}, "logprobs": None,
                            "finish_reason": None}])
                else:
                    chunk([{"index": index, "text": payload, "logprobs": None,
                            "finish_reason": None, "stop_reason": None}])
            elif event == "finish":
                finishes[index] = payload
                final = {"index": index, "logprobs": None,
                         "finish_reason": payload["finish_reason"],
                         "stop_reason": payload["stop_reason"]}
                if chat:
                    final["delta"] = {}
                else:
                    final["text"] = ""
                chunk([final])
            else:
                self.write_event({"error": {"message": payload, "type": "InternalServerError",
                                            "param": None, "code": 500}})
                break
        if params["include_usage"] and all(finishes):
            chunk([], usage(finishes))
        self.write_event("[DONE]")
        self.write_chunk(b"")


def usage(finishes):
    prompt = sum(f["prompt_tokens"] for f in finishes)
    completion = sum(f["completion_tokens"] for f in finishes)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(f["cached_tokens"] for f in finishes)}}


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections do not hold up the exit
    request_queue_size = 256  # a gateway opens many connections at once; 5 would drop them
    allow_reuse_address = True


# --------------------------------------------------------------------------------------------
# Start-up and shutdown
# --------------------------------------------------------------------------------------------

def parse_args(argv):
    def positive(kind):
        def parse(text):
            try:
                value = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
            if value <= 0:
                raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
            return value
        return parse

    def non_negative(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
        return value

    env_port = os.environ.get("PORT", "8000")
    parser = argparse.ArgumentParser(
        description="gpufleet's reference model server (random weights; for tests and demos)")
    # gpufleet gives a replica its node's address in HOST (where gateways reach it).
    parser.add_argument("--host", default=os.environ.get("HOST") or "127.0.0.1",
                        help="address to listen on (default: $HOST, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port to listen on (default: $PORT, else 8000)")
    parser.add_argument("--model-name",
                        default=os.environ.get("GPUFLEET_DEPLOYMENT") or "reference",
                        help="served model name (default: $GPUFLEET_DEPLOYMENT, else reference)")
    parser.add_argument("--load-delay", type=non_negative, default=0.0,
                        help="extra seconds before /health turns 200, modelling a large "
                        "model's load time in cold-start tests (default 0)")
    parser.add_argument("--threads", type=positive(int), default=1,
                        help="torch CPU threads (default 1, so several replicas share a core)")
    parser.add_argument("--layers", type=positive(int), default=4)
    parser.add_argument("--d-model", type=positive(int), default=256)
    parser.add_argument("--heads", type=positive(int), default=4)
    parser.add_argument("--seed", type=int, default=0, help="weights' seed")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="weights and KV cache (default bfloat16: Debian's torch runs "
                        "float32 matrix products on the reference BLAS, bfloat16 ones on oneDNN, "
                        "10-30x faster)")
    parser.add_argument("--max-model-len", type=positive(int), default=2048,
                        help="prompt + completion tokens of one sequence")
    parser.add_argument("--max-prompt-tokens", type=positive(int), default=None,
                        help="default: max-model-len - 1")
    parser.add_argument("--max-tokens-limit", type=positive(int), default=1024,
                        help="the largest max_tokens a request may ask for")
    parser.add_argument("--default-chat-max-tokens", type=positive(int), default=128)
    parser.add_argument("--max-num-seqs", type=positive(int), default=16,
                        help="sequences decoded together; the rest wait")
    parser.add_argument("--max-num-batched-tokens", type=positive(int), default=512,
                        help="tokens computed per engine step (prefill chunk size)")
    parser.add_argument("--num-kv-blocks", type=positive(int), default=512)
    parser.add_argument("--block-size", type=positive(int), default=16,
                        help="tokens per KV block")
    parser.add_argument("--lora-modules", nargs="*", default=[],
                        help="names of the LoRA adapters to serve (vLLM's name=path works too; "
                        "the path is ignored)")
    parser.add_argument("--max-loras", type=positive(int), default=1,
                        help="adapters loaded at a time")
    parser.add_argument("--lora-load-delay", type=non_negative, default=0.25,
                        help="seconds loading an adapter takes beyond materialising its "
                        "weights, modelling reading them from storage (default 0.25)")
    parser.add_argument("--max-body-bytes", type=positive(int), default=1 << 20)
    parser.add_argument("--drain-timeout", type=non_negative, default=30.0,
                        help="seconds SIGTERM waits for in-flight requests before exiting")
    parser.add_argument("--log-requests", action="store_true")
    args = parser.parse_args(argv)
    if args.port is None:
        try:
            args.port = int(env_port)
        except ValueError:
            parser.error(f"the PORT environment variable is not a port number: {env_port!r}")
    if not 0 <= args.port <= 65535:
        parser.error(f"port {args.port} is out of range")
    if args.max_prompt_tokens is None:
        args.max_prompt_tokens = args.max_model_len - 1
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    # vLLM's form is name=path; the path means nothing here (adapters are random).
    args.lora_modules = [module.split("=", 1)[0] for module in args.lora_modules]
    for name in args.lora_modules:
        if name == args.model_name or not name or "," in name:
            parser.error(f"bad LoRA adapter name {name!r}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    engine = Engine(args, args.model_name)
    state = ServerState(args, engine)
    if ":" in args.host:
        Server.address_family = socket.AF_INET6
    try:
        server = Server((args.host, args.port), Handler)
    except OSError as error:
        log(f"cannot listen on {args.host}:{args.port}: {error}")
        return 2
    server.state = state
    port = server.server_address[1]
    log(f"listening on {args.host}:{port}, model {args.model_name!r}")

    def load():
        started = time.monotonic()
        try:
            engine.load()
        except Exception:  # noqa: BLE001 - report and exit: a replica that cannot load is dead
            log("loading the model failed:\n" + traceback.format_exc())
            os._exit(3)
        time.sleep(args.load_delay)
        state.ready.set()
        log(f"model loaded in {time.monotonic() - started:.2f} s; ready")

    threading.Thread(target=load, name="loader", daemon=True).start()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()

    terms = []

    def on_signal(signum, _frame):
        terms.append(time.monotonic())
        if len(terms) > 1:
            log("second signal: exiting now")
            os._exit(1)
        log("draining: no new requests; finishing the in-flight ones")
        state.draining.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        time.sleep(0.05)
        if not terms:
            continue
        if not state.busy() and (engine.model is None or engine.idle()):
            log("drained; exiting")
            server.server_close()
            sys.stdout.flush()
            os._exit(0)
        if time.monotonic() - terms[0] > args.drain_timeout:
            log(f"drain timeout of {args.drain_timeout} s: exiting with requests in flight")
            os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
