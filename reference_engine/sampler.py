"""Per-row sampling settings as device tensors, the sampling op, and log-probabilities when asked.

Each sampled row carries its request's settings. The seed of a row is the request's seed plus the
number of tokens it has generated so far, so a seeded request draws the same tokens whatever else
shares its batch. Rows below `min_tokens` get their stop tokens masked to -inf first.

Sampler graphs (`graphs=True`, CUDA; the runner turns them on with decode graphs): the sampling op is some forty small
torch launches, and each costs host time that a sampled decode step adds to the device's (run72, H100: a sampled
async step 2.86 ms against 2.52 greedy). For logits in a static buffer (a decode graph's output), `launch` records the
op once per (buffer, rows, path) in a CUDA graph that reads the rows' settings from static device buffers, and then
replays it: two host-to-device copies of the settings and one graph launch. The path is the op's (greedy rows only
never sample; unfiltered; the sort; or the top-k selection of `SELECT_SIZES` candidates, the least one >= the rows'
largest top-k, which draws what the op draws with the exact bound). The first call of a key runs the op eagerly (its
real result), then records it (no device synchronisation). Rows with banned ids, logits of more than
`GRAPH_MAX_ELEMENTS`, and keys past `MAX_GRAPHS` take the op eagerly. The key holds the logits' address, so a graph
reads whatever tensor the call passes there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.ops.sampling import (
    TOP_K_SELECT_MAX,
    sample_tokens_unchecked,
    top_k_bound,
)

SELECT_SIZES = (32, 128, TOP_K_SELECT_MAX)  # candidate counts a sampler graph selects (few keys, few recordings)
GRAPH_MAX_ELEMENTS = 8 * 248_320  # rows x vocab a sampler graph takes: its pool keeps the op's [rows, V] temporaries
# (about 28 bytes an element on the selection path, 56 MB here); larger batches run the op eagerly, where their device
# time hides the launches anyway
MAX_GRAPHS = 32  # recordings kept; past this, new keys run eagerly


@dataclass(frozen=True)
class SamplingRow:
    temperature: float  # 0: greedy
    top_k: int  # 0: disabled
    top_p: float
    seed: int  # request seed + step
    banned_token_ids: tuple[int, ...] = ()  # stop tokens not allowed yet (min_tokens)
    num_logprobs: int | None = None


class Sampler:
    def __init__(self, device: torch.device | str, max_num_seqs: int, graphs: bool = False) -> None:
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs
        self.use_graphs = graphs and self.device.type == "cuda"
        self._out = torch.empty(max_num_seqs, dtype=torch.int64, device=self.device)  # [S]
        self._floats = torch.zeros(2, max_num_seqs, dtype=torch.float32, device=self.device)  # temperature, top_p
        self._ints = torch.zeros(2, max_num_seqs, dtype=torch.int64, device=self.device)  # seeds, top_k
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.replays = 0
        self._pool = self._capture_stream = None

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow], static: bool = False) -> tuple[list[int], list[dict[int, float] | None]]:
        """logits [S, V] float32, one row per entry of `rows`; returns the token ids and per-row logprobs (or None).
        static: logits lie in a buffer that later calls pass again (a decode graph's output; see `launch`)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits must be [{len(rows)}, vocab], got {list(logits.shape)}")
        if not rows:
            return [], []
        tokens = self.launch(logits, rows, static=static).tolist()
        return tokens, self._logprobs(logits.float(), rows, tokens)

    def graph_key(self, logits: torch.Tensor, rows: list[SamplingRow]) -> tuple | None:
        """The sampler graph `launch(logits, rows, static=True)` replays (recording it first if it is not in `graphs`),
        or None where it runs the op eagerly (graphs off, greedy rows only, banned ids, logits not float32)."""
        if not self.use_graphs or logits.dtype != torch.float32 or all(row.temperature == 0 for row in rows):
            return None
        if any(row.banned_token_ids for row in rows) or logits.numel() > GRAPH_MAX_ELEMENTS:
            return None
        vocab = logits.shape[1]
        temperatures, top_ks = [row.temperature for row in rows], [row.top_k for row in rows]
        filtered = any(0 < row.top_k < vocab or row.top_p < 1 for row in rows)
        bound = top_k_bound(temperatures, top_ks, vocab)
        if not filtered:
            path: tuple = ("plain",)
        elif bound is not None and bound <= min(TOP_K_SELECT_MAX, vocab - 1):
            path = ("select", min(size for size in SELECT_SIZES if size >= bound))
        else:
            path = ("sort",)
        key = (logits.data_ptr(), tuple(logits.shape), tuple(logits.stride()), path)
        return key if key in self.graphs or len(self.graphs) < MAX_GRAPHS else None

    def _graph_launch(self, logits: torch.Tensor, rows: list[SamplingRow], key: tuple) -> torch.Tensor:
        num_rows = len(rows)
        floats = torch.tensor([[row.temperature for row in rows], [row.top_p for row in rows]], dtype=torch.float32)
        ints = torch.tensor([[row.seed for row in rows], [row.top_k for row in rows]], dtype=torch.int64)
        # pinned blocks of torch's caching host allocator are not reused before their copy has run
        self._floats[:, :num_rows].copy_(floats.pin_memory(), non_blocking=True)
        self._ints[:, :num_rows].copy_(ints.pin_memory(), non_blocking=True)
        path = key[3]

        def sample() -> torch.Tensor:
            return sample_tokens_unchecked(
                logits, self._floats[0, :num_rows], self._ints[1, :num_rows], self._floats[1, :num_rows], self._ints[0, :num_rows],
                self._out[:num_rows], all_greedy=False, filtered=path[0] != "plain", candidates=path[1] if path[0] == "select" else None,
            )  # fmt: skip

        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return self._out[:num_rows]
        tokens = sample()  # the first call of a key: the real result, run eagerly (and a warm-up for the recording)
        if self._pool is None:
            self._pool, self._capture_stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream(self.device)
        # Recorded on a side stream ordered after the work queued so far, without the device-wide synchronisation of
        # `torch.cuda.graph` (a decode step launched ahead must not wait for the device). Recording runs nothing, so
        # the tokens above stay as they are; the graph's temporaries come from its own pool.
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self._capture_stream.wait_stream(current)
        with torch.cuda.stream(self._capture_stream):
            graph.capture_begin(pool=self._pool)
            try:
                sample()
            finally:
                graph.capture_end()
        current.wait_stream(self._capture_stream)
        self.graphs[key] = graph
        return tokens

    def launch(self, logits: torch.Tensor, rows: list[SamplingRow], static: bool = False) -> torch.Tensor:
        """Queue the sampling of `rows` without a host read: [S] int64 tokens on the device, a view of a buffer the next
        call overwrites. The rows' settings decide the path on the host (SamplingParams has checked them). static:
        logits lie in a buffer that later calls pass again, so a sampler graph may read it (`graph_key`)."""
        num_rows = len(rows)
        if logits.dim() != 2 or logits.shape[0] != num_rows or num_rows == 0:
            raise ValueError(f"logits must be [{num_rows}, vocab] with at least one row, got {list(logits.shape)}")
        if num_rows > self.max_num_seqs:
            raise ValueError(f"{num_rows} rows to sample, the sampler was sized for {self.max_num_seqs}")
        logits = logits.float()
        key = self.graph_key(logits, rows) if static else None
        if key is not None:
            return self._graph_launch(logits, rows, key)
        vocab = logits.shape[1]
        banned = [(i, t) for i, row in enumerate(rows) for t in row.banned_token_ids if t < logits.shape[1]]
        if banned:
            logits = logits.clone()
            index = torch.tensor(banned, dtype=torch.int64, device=logits.device)  # [N, 2]
            logits[index[:, 0], index[:, 1]] = float("-inf")
        temperature = torch.tensor([row.temperature for row in rows], dtype=torch.float32)  # [S], on the host first:
        top_k = torch.tensor([row.top_k for row in rows], dtype=torch.int32)  # the path is decided from these
        top_p = torch.tensor([row.top_p for row in rows], dtype=torch.float32)  # exactly as sample_tokens decides it
        seeds = torch.tensor([row.seed for row in rows], dtype=torch.int64)  # on the device, with no device read
        all_greedy = bool((temperature == 0).all())
        filtered = bool((((top_k > 0) & (top_k < vocab)) | (top_p < 1)).any())
        candidates = top_k_bound([row.temperature for row in rows], [row.top_k for row in rows], vocab)
        out = self._out[:num_rows]
        if self.device.type == "cuda":  # a copy from pageable memory would wait for the stream (torch syncs it); pinned
            # blocks from torch's caching host allocator are not reused before their copy has run
            temperature, top_k, top_p, seeds = (t.pin_memory().to(self.device, non_blocking=True) for t in (temperature, top_k, top_p, seeds))
        return sample_tokens_unchecked(logits, temperature, top_k, top_p, seeds, out, all_greedy=all_greedy, filtered=filtered,
                                       candidates=candidates)

    @staticmethod
    def _logprobs(logits: torch.Tensor, rows: list[SamplingRow], tokens: list[int]) -> list[dict[int, float] | None]:
        wanted = [i for i, row in enumerate(rows) if row.num_logprobs is not None]
        result: list[dict[int, float] | None] = [None] * len(rows)
        if not wanted:
            return result
        log_probs = torch.log_softmax(logits[wanted], dim=-1)  # [W, V] of the model's own distribution
        largest = max(rows[i].num_logprobs for i in wanted)
        values, ids = log_probs.topk(min(largest, log_probs.shape[1]), dim=-1) if largest else (None, None)
        for position, row_index in enumerate(wanted):
            count = rows[row_index].num_logprobs
            entry: dict[int, float] = {}
            if count:
                entry = dict(zip(ids[position, :count].tolist(), values[position, :count].tolist()))
            token = tokens[row_index]
            entry[token] = float(log_probs[position, token])
            result[row_index] = entry
        return result
