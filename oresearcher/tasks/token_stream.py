"""The synthetic token stream, generated without a Python loop per position, and a
background prefetcher that takes it off the training step's critical path.

The stream (see :mod:`oresearcher.tasks.synthetic_lm`) is a noisy first-order Markov
chain: ``x[t+1] = rand[t]`` where ``jump[t]`` (probability ``noise``), else
``perm[x[t]]``. The draws are taken from one CPU ``torch.Generator`` in a fixed order
(start tokens [B], jump uniforms [B, T], jump targets [B, T]), so the stream is the same
on every backend and device, and its state is that generator's state.

Vectorised: call position ``p``'s *anchor* the last position ``s <= p`` that was set
from a draw (0 or a jump). Then ``x[p] = perm^(p - s)(x[s])``: the anchor index comes
from a cumulative max over the jump mask, and ``perm^k`` is applied by binary lifting
(tables ``perm^(2^j)``, j < log2(T + 1), built once per stream; one gather per bit of
k). Integer gathers are exact, so the tokens are bit-identical to the loop
(:func:`reference_batch`, kept as the slow obvious reference the tests compare with).

Cost at gpt-2's vocabulary and 8 x 2048 tokens, one CPU core: ~1 ms per batch against
~22 ms for the loop (``python benchmarks/bench_data.py``).
"""
from __future__ import annotations

import queue
import threading

import torch

from ..seeds import STREAM, derive

NOISE = 0.1  # probability that the next token is a uniform draw rather than perm[token]


def draws(vocab: int, batch: int, seq_len: int, noise: float, gen: torch.Generator):
    """The batch's random draws, in the stream's fixed order: start tokens [B] (int64),
    jump mask [B, T] (bool), jump targets [B, T] (int64)."""
    start = torch.randint(vocab, (batch,), generator=gen)
    jumps = torch.rand(batch, seq_len, generator=gen) < noise
    rand = torch.randint(vocab, (batch, seq_len), generator=gen)
    return start, jumps, rand


def reference_batch(perm: torch.Tensor, noise: float, batch: int, seq_len: int,
                    gen: torch.Generator) -> torch.Tensor:
    """The chain one position at a time: the definition (and the original implementation)."""
    start, jumps, rand = draws(len(perm), batch, seq_len, noise, gen)
    x = torch.empty(batch, seq_len + 1, dtype=torch.long)
    x[:, 0] = start
    for t in range(seq_len):
        x[:, t + 1] = torch.where(jumps[:, t], rand[:, t], perm[x[:, t]])
    return x


def power_tables(perm: torch.Tensor, max_steps: int) -> list[torch.Tensor]:
    """[perm^(2^j) for j = 0 .. bit_length(max_steps) - 1] (composition of the
    permutation with itself, as index maps)."""
    tables = [perm]
    while (1 << len(tables)) <= max_steps:
        p = tables[-1]
        tables.append(p[p])
    return tables


def chain_batch(tables: list[torch.Tensor], start: torch.Tensor, jumps: torch.Tensor,
                rand: torch.Tensor) -> torch.Tensor:
    """LongTensor[B, T + 1] from the draws, vectorised (see the module docstring)."""
    batch, seq_len = jumps.shape
    anchor_vals = torch.cat([start[:, None], rand], dim=1)  # value at each draw position
    pos = torch.arange(seq_len + 1)
    is_anchor = torch.cat([torch.ones(batch, 1, dtype=torch.bool), jumps], dim=1)
    anchor = torch.where(is_anchor, pos, 0).cummax(dim=1).values  # [B, T + 1] last anchor index
    x = anchor_vals.gather(1, anchor)
    k = pos - anchor  # steps of perm since the anchor, < 2^len(tables)
    for j, table in enumerate(tables):
        bit = (k >> j) & 1
        if bool(bit.any()):
            x = torch.where(bit.bool(), table[x], x)
    return x


class TokenStream:
    """Infinite iterator of LongTensor[batch, seq_len + 1] (inputs + shifted targets) on
    ``device``. Resumable: its state is its generator's (``state_dict``)."""

    def __init__(self, vocab: int, batch: int, seq_len: int, seed: int, rank: int, noise: float = NOISE,
                 device="cpu"):
        self.vocab, self.batch, self.seq_len, self.noise, self.device = vocab, batch, seq_len, noise, device
        self.perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
        self.gen = torch.Generator().manual_seed(derive(seed, rank + 1, prime=STREAM))
        self.tables = power_tables(self.perm, seq_len)

    def __iter__(self):
        return self

    def next_cpu(self) -> torch.Tensor:
        """The next batch on the CPU (the prefetcher pins and moves it)."""
        return chain_batch(self.tables, *draws(self.vocab, self.batch, self.seq_len, self.noise, self.gen))

    def __next__(self) -> torch.Tensor:
        return self.next_cpu().to(self.device)

    def state_dict(self) -> dict:
        return {"generator": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["generator"])


_STOP = object()


class Prefetcher:
    """Runs ``stream.next_cpu()`` in a background thread ``depth`` batches ahead.

    Batches come out in the stream's order, so values never depend on timing. On CUDA
    each batch is pinned and copied with ``non_blocking=True`` on a side stream, and
    the consumer's stream waits for that copy (torch's pinned-memory guidance). The
    checkpointed state is the stream's state *after the last batch handed out*, not the
    thread's look-ahead: each queued batch carries the generator state that follows it,
    so a resumed run continues exactly where the consumer was. torch ops release the
    GIL, so the thread overlaps the step's own work.
    """

    def __init__(self, stream: TokenStream, depth: int = 2):
        self.stream, self.depth = stream, max(1, int(depth))
        self.device = torch.device(stream.device)
        self._state = stream.state_dict()
        self._start()

    def _start(self) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="token-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cuda = self.device.type == "cuda"
        if cuda and self.device.index is not None:
            torch.cuda.set_device(self.device)  # a new thread starts on device 0
        side = torch.cuda.Stream(self.device) if cuda else None
        try:
            while not self._halt.is_set():
                x = self.stream.next_cpu()
                state = self.stream.state_dict()
                event = None
                if cuda:
                    with torch.cuda.stream(side):
                        x = x.pin_memory().to(self.device, non_blocking=True)
                        event = torch.cuda.Event()
                        event.record(side)
                elif self.device.type != "cpu":
                    x = x.to(self.device)
                while not self._halt.is_set():
                    try:
                        self._queue.put((x, state, event), timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # surface the failure to the consumer
            self._queue.put((_STOP, e, None))

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        x, state, event = self._queue.get()
        if x is _STOP:
            raise RuntimeError("token prefetch thread failed") from state
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            x.record_stream(current)  # allocated on the side stream, used on this one
        self._state = state
        return x

    def close(self) -> None:
        self._halt.set()
        self._thread.join()

    def state_dict(self) -> dict:
        return {"generator": self._state["generator"].clone()}

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.stream.load_state_dict(state)
        self._state = self.stream.state_dict()
        self._start()
