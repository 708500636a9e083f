"""Training: advantages, losses and the algorithm config (batching and the trainer follow)."""

from reinforge.train.algorithm import (
    AdvantageConfig,
    AggregationConfig,
    AlgorithmConfig,
    ConstantNorm,
    DrGRPOAdvantage,
    GRPOAdvantage,
    LossConfig,
    PPOClipLoss,
    SequenceMean,
    SFTLoss,
    TokenMean,
)
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
