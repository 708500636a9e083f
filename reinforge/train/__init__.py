"""Training: advantages, losses and the algorithm config (batching and the trainer follow)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reinforge.train.algorithm import (
    AdvantageConfig,
    AlgorithmConfig,
    DrGRPOAdvantage,
    GRPOAdvantage,
    LossConfig,
    PPOClipLoss,
    SFTLoss,
)
from reinforge.train.token_weights import AggregationConfig, ConstantNorm, SequenceMean, TokenMean

if TYPE_CHECKING:
    from reinforge.train.losses import LikelihoodMetrics, PolicyMetrics

__all__ = [
    "AdvantageConfig",
    "AggregationConfig",
    "AlgorithmConfig",
    "ConstantNorm",
    "DrGRPOAdvantage",
    "GRPOAdvantage",
    "LikelihoodMetrics",
    "LossConfig",
    "PPOClipLoss",
    "PolicyMetrics",
    "SequenceMean",
    "SFTLoss",
    "TokenMean",
]


def __getattr__(name: str) -> Any:
    """`losses` needs torch, so it loads when first asked for: a command reads this package
    (`reinforge.train.config`) to check its config before it pays for torch."""
    if name in ("LikelihoodMetrics", "PolicyMetrics"):
        from reinforge.train import losses

        return getattr(losses, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
