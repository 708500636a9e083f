"""Training: advantages, losses and the algorithm config (batching and the trainer follow)."""

from reinforge.train.config import (
    AdvantageConfig,
    AggregationConfig,
    AlgorithmConfig,
    ConstantNorm,
    DrGRPOAdvantage,
    GRPOAdvantage,
    LossConfig,
    PPOClipLoss,
    SequenceMean,
    TokenMean,
)
from reinforge.train.losses import PolicyMetrics

__all__ = [
    "AdvantageConfig",
    "AggregationConfig",
    "AlgorithmConfig",
    "ConstantNorm",
    "DrGRPOAdvantage",
    "GRPOAdvantage",
    "LossConfig",
    "PPOClipLoss",
    "PolicyMetrics",
    "SequenceMean",
    "TokenMean",
]
