"""Sampling a batch of next tokens, each row with its own settings and random stream.

The log-prob returned for a token is under the distribution it was actually drawn from:
logits divided by the row's temperature, then restricted to the row's top-p nucleus and
renormalised. At temperature 1 and top_p 1 that is exactly the policy's log-prob, which is
what the trainer recomputes. Greedy rows (temperature 0) report the unscaled log-softmax.
A row that asks for its most likely tokens (`top_logprobs`) gets them from that same
distribution, so the sampled token's log-prob is its own entry there when it is among them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """One request's settings, as the server resolved them from the request and its config."""

    max_tokens: int
    temperature: float
    top_p: float
    stop_loops: bool
    """End the completion at the first token whose tail loops (finish reason "loop")."""
    stop: tuple[str, ...] = ()
    seed: int | None = None
    """None: an unseeded draw."""
    top_logprobs: int = 0
    """How many of the most likely tokens to keep beside each sampled one, with their
    log-probs; 0 keeps (and computes) none."""


TopLogprobs = list[tuple[int, float]]
"""The most likely tokens at one position, (token id, log-prob), most likely first."""
Draws = tuple[torch.Tensor, torch.Tensor, list[TopLogprobs | None]]
"""What `sample` drew: tokens (B,), their log-probs (B,), each row's alternatives."""


@dataclass
class RowSampler:
    """One request's sampling settings and its private random stream.

    A private generator makes a seeded request reproducible whatever else shares its batch.
    """

    params: SamplingParams
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator()
        if self.params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.params.seed)


def sample(logits: torch.Tensor, rows: list[RowSampler]) -> Draws:
    """Draw one token per row. logits: (B, V) -> tokens (B,), logprobs (B,) in float32,
    and each row's most likely tokens (None for a row that asks for none).

    A step's (B, V) temporaries are few and changed in place: at batch 32 over a 49k
    vocabulary each is 6-12 MB, and six fresh ones per step made the allocator hand back
    new pages (faulted in on first touch) that cost five times the arithmetic. Steps that
    change nothing are skipped: dividing by a temperature of 1, an argmax with no greedy
    row. The numbers, and so the tokens a seed draws, are the same.
    """
    logits = logits.float()  # (B, V)
    device = logits.device
    # In float32, as the logits are divided: a temperature that rounds to 0 is greedy.
    temperatures = torch.tensor([r.params.temperature for r in rows]).tolist()
    greedy_rows = [t <= 0 for t in temperatures]
    divisors = [1.0 if t <= 0 else t for t in temperatures]
    scaled = logits
    if any(d != 1 for d in divisors):
        scaled = logits / torch.tensor(divisors, device=device).unsqueeze(1)  # (B, V)
    logp = torch.log_softmax(scaled, dim=-1)  # (B, V)
    top_p = [r.params.top_p for r in rows]
    if any(p < 1 for p in top_p):
        logp = _nucleus(logp, torch.tensor(top_p, device=device))
    # Inverse-CDF draw: one uniform per row from that row's own generator. (Gumbel-max
    # needs a uniform per vocabulary entry, which cost ~20% of a decode step at batch 32.)
    # The generators stay on the host, so a seed draws the same uniforms on any device.
    cdf = logp.double().exp_().cumsum_(dim=-1)  # (B, V)
    uniform = torch.cat([torch.rand(1, generator=r.generator, dtype=torch.float64) for r in rows])
    uniform = uniform.to(device)  # (B,)
    target = (uniform * cdf[:, -1]).unsqueeze(1)  # (B, 1)
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1)  # (B,)
    tokens = tokens.clamp_(max=logits.shape[1] - 1)
    if any(greedy_rows):
        greedy = torch.tensor(greedy_rows, device=device)  # (B,)
        tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1), _most_likely(logp, rows)


def _most_likely(logp: torch.Tensor, rows: list[RowSampler]) -> list[TopLogprobs | None]:
    """The `top_logprobs` largest entries of each asking row of `logp` (B, V), sorted;
    a batch where no row asks costs nothing."""
    asking = [i for i, r in enumerate(rows) if r.params.top_logprobs]
    top: list[TopLogprobs | None] = [None] * len(rows)
    if not asking:
        return top
    k = max(rows[i].params.top_logprobs for i in asking)
    values, ids = torch.topk(logp[asking], k, dim=-1)  # (A, k), descending
    for i, row_ids, row_values in zip(asking, ids.tolist(), values.tolist(), strict=True):
        wanted = rows[i].params.top_logprobs
        top[i] = list(zip(row_ids[:wanted], row_values[:wanted], strict=True))
    return top


def _nucleus(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches top_p; renormalise. (B, V)."""
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True)  # (B, V)
    mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()  # (B, V)
    drop_sorted = mass_before >= top_p.unsqueeze(1)  # (B, V); the top token always stays
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)
