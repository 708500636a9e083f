"""A machine's timings for the simulator: what `reinforge sim calibrate` measures and
`reinforge sim predict` reads, as a small JSON file.

Curves are kept as measured points and read by linear interpolation, extended along the
last segment past the ends: a fitted law would hide where the engine changes regime (a
decode step is flat while it is bound by reading the weights, then grows with the batch).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from reinforge.errors import UsageError, first_problem
from reinforge.types import Record


class Point(Record):
    x: float
    """Batch rows (decode) or tokens (prefill)."""
    seconds: float = Field(gt=0.0)


class Curve(Record):
    points: list[Point] = Field(min_length=1)
    """Sorted by `x`."""

    def __call__(self, x: float) -> float:
        """The time at `x`, never below the smallest measured time."""
        points = self.points
        if len(points) == 1 or x <= points[0].x:
            return points[0].seconds  # below the first point: a step's floor
        pairs = list(zip(points, points[1:], strict=False))
        low, high = next(((a, b) for a, b in pairs if x <= b.x), pairs[-1])
        slope = (high.seconds - low.seconds) / (high.x - low.x) if high.x > low.x else 0.0
        return max(low.seconds + slope * (x - low.x), min(p.seconds for p in points))

    @classmethod
    def of(cls, pairs: list[tuple[float, float]]) -> Curve:
        return cls(points=[Point(x=x, seconds=s) for x, s in sorted(pairs)])


class TrainerTimes(Record):
    """A trainer step as the loop makes it: `fixed_s + tokens / tokens_per_s`, tokens being
    every token of the trained sequences (prompt, tool output and completion all run
    through forward and backward). Fitted by least squares to the measured steps."""

    fixed_s: float
    tokens_per_s: float
    measured: list[Point]
    """(sequence tokens, seconds of the step without the sync) as timed."""

    def seconds(self, tokens: float, devices: int = 1) -> float:
        """Data parallel over `devices`, scaling perfectly (an assumption, not a
        measurement: one device is all calibration sees)."""
        return self.fixed_s + tokens / (self.tokens_per_s * devices)


class Sharing(Record):
    """How much slower each side runs while the other works on the same device (a
    colocated async loop): measured, not assumed, since it depends on the machine."""

    decode: float = Field(ge=1.0)
    """A decode step's time while the trainer trains, over its time alone."""
    train: float = Field(ge=1.0)
    """A trainer step's time while the engine decodes, over its time alone."""


class Profile(Record):
    model: str
    engine: str
    dtype: str
    threads: int
    """torch's intra-op threads when measured."""
    decode: Curve
    """Seconds of one engine iteration's decode at `x` rows."""
    prefill: Curve
    """Seconds of one prefill of `x` new prompt tokens (admission, or a recompute after a
    weight update)."""
    trainer: TrainerTimes
    sync_s: float
    """The loop's weight sync on this machine (for the built-in fp32 engine, which shares
    the trainer's weights, this is the optimizer step taken inside the engine's update)."""
    sharing: Sharing

    def save(self, path: Path) -> None:
        try:
            path.write_text(self.model_dump_json(indent=1) + "\n", encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {path}: {error.strerror}") from error

    @classmethod
    def load(cls, path: Path) -> Profile:
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise UsageError(
                f"cannot read profile {path}: {error.strerror} "
                "(make one with `reinforge sim calibrate`)"
            ) from error
        except ValidationError as error:
            where, problem = first_problem(error)
            raise UsageError(f"{path} is not a sim profile: {where}: {problem}") from error
