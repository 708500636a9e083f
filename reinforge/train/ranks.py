"""Ranks: processes joined in one process group, each holding one object (a sharded
trainer) that the driving process calls. Every call goes to every rank, since each is a
round of collectives, and the first failure ends them all: a rank that raises, dies, or
waits in a collective past `trainer.collective_timeout_s` never hangs the driver.

`LocalRanks` starts them on this machine with multiprocessing (spawn) and a file
rendezvous, so there is no port to pick; Ray actors stand in for them across machines
(`orchestrate/cluster.py`), behind the same `Ranks`. `run_on_ranks` is the one-shot form:
a function on every rank. Under torchrun, start the process group yourself;
`ShardedTrainer` works in any.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reinforge.errors import UsageError, describe
from reinforge.policy.threads import usable_cpus
from reinforge.train.config import TrainerConfig

Result = TypeVar("Result")
STOP_S = 30.0
"""How long a rank may take to leave after `stop` before it is killed."""


class RankFailed(UsageError):
    """A rank raised, died or timed out. Not the user's mistake, but told as one: one line,
    the run stopped with every rank, and `--resume` goes on from its last checkpoint."""


class Ranks(Protocol):
    """`world_size` ranks, each holding the object its `factory(rank, ...)` made."""

    def sees(self, folder: Path) -> bool:
        """Whether every rank sees `folder` as the driving process does (the same machine,
        or storage they all mount at that path), so that the ranks may read and write the
        driver's files there by their paths."""
        ...

    def call(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` of every rank's object at once; the answers in rank order, or
        `RankFailed` for the first rank to fail (and the ranks are stopped)."""
        ...

    def stop(self) -> None: ...


def join_group(rank: int, config: TrainerConfig, init_method: str) -> None:
    """This process as rank `rank` of the group (gloo on CPU, NCCL with one GPU per rank),
    its collectives failing after `config.collective_timeout_s`."""
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=config.world_size,
        timeout=timedelta(seconds=config.collective_timeout_s),
    )


class LocalRanks:
    """The ranks as processes of this machine, each building its object after joining the
    group; they end with `stop`, and on their own should this process die (their pipe to it
    closes)."""

    def __init__(self, config: TrainerConfig, factory: Callable[..., object], *args: Any) -> None:
        if torch.cuda.is_available() and config.world_size > torch.cuda.device_count():
            raise UsageError(
                f"trainer.world_size = {config.world_size} needs one GPU per rank; "
                f"{torch.cuda.device_count()} visible"
            )
        self._folder = Path(tempfile.mkdtemp(prefix="reinforge-ranks-"))
        rendezvous = (self._folder / "rendezvous").as_uri()
        context = mp.get_context("spawn")
        self._pipes: list[Connection] = []
        self._processes: list[Any] = []
        for rank in range(config.world_size):
            ours, theirs = context.Pipe()
            process = context.Process(
                target=_serve,
                args=(theirs, rank, config, rendezvous, factory, args),
                name=f"reinforge-rank-{rank}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._pipes.append(ours)
            self._processes.append(process)
        try:
            self._answers()  # every rank joined and built its object
        except BaseException:
            self.stop(wait_s=0.0)
            raise

    def sees(self, folder: Path) -> bool:
        """Processes of this machine: they see all it does."""
        return True

    def call(self, method: str, *args: Any) -> list[Any]:
        try:
            for rank, pipe in enumerate(self._pipes):
                try:
                    pipe.send((method, args))
                except OSError:  # it died while nothing was asked of it
                    raise self._died(rank) from None
            return self._answers()
        except BaseException:  # the others may be waiting for the one that failed
            self.stop(wait_s=0.0)
            raise

    def _answers(self) -> list[Any]:
        """Each rank's answer, waiting on all of them at once: the first to fail or die
        is the error, while the others may still wait in a collective for it."""
        answers: dict[int, Any] = {}
        pending = dict(enumerate(self._pipes))
        while pending:
            sentinels = {self._processes[r].sentinel: r for r in pending}
            for ready in wait([*pending.values(), *sentinels]):
                rank = sentinels.get(ready)  # type: ignore[call-overload]
                if rank is not None:  # exited: an answer it sent first is still read
                    if rank in pending and not pending[rank].poll():
                        raise self._died(rank)
                    continue
                rank = next(r for r, pipe in pending.items() if pipe is ready)
                try:  # a tensor in the answer is fetched from the rank: OSError if it died
                    ok, value = pending.pop(rank).recv()
                except (EOFError, OSError):
                    raise self._died(rank) from None
                if not ok:
                    raise RankFailed(f"trainer rank {rank}: {value}")
                answers[rank] = value
        return [answers[rank] for rank in range(len(self._pipes))]

    def _died(self, rank: int) -> RankFailed:
        process = self._processes[rank]
        process.join(timeout=STOP_S)  # its pipe closes as it exits: the code follows
        return RankFailed(f"trainer rank {rank} died (exit code {process.exitcode})")

    def stop(self, wait_s: float = STOP_S) -> None:
        """Each rank leaves the group and exits, or is killed after `wait_s`."""
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:
                pass  # that rank is gone already
        for process in self._processes:
            process.join(timeout=wait_s)
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._processes = [], []
        shutil.rmtree(self._folder, ignore_errors=True)


def _serve(
    pipe: Connection,
    rank: int,
    config: TrainerConfig,
    init_method: str,
    factory: Callable[..., object],
    args: tuple[Any, ...],
) -> None:
    """A rank's life: join the group, build the object, answer calls until told to stop
    (None) or until the driver is gone. Ctrl-C, which a terminal sends to every process of
    the run, and SIGTERM, which a scheduler may, are the driver's to act on: it still needs
    the ranks to save a checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not torch.cuda.is_available():  # the ranks share the cores rather than each taking all
        torch.set_num_threads(max(1, usable_cpus() // config.world_size))
    try:
        join_group(rank, config, init_method)
        target = factory(rank, *args)
    except BaseException as error:  # noqa: BLE001 - told to the driver, which raises it
        pipe.send((False, failure_line(error)))
        return
    pipe.send((True, None))
    try:
        while True:
            try:
                request = pipe.recv()
            except (EOFError, OSError):
                return  # the driver died, perhaps while sending
            if request is None:
                return
            method, call_args = request
            try:
                answer = (True, getattr(target, method)(*call_args))
            except BaseException as error:  # noqa: BLE001 - told to the driver
                answer = (False, failure_line(error))
            try:
                pipe.send(answer)
            except OSError:
                return
    finally:
        dist.destroy_process_group()


def failure_line(error: BaseException) -> str:
    """A rank's failure as one line for the driver; a usage error is its message alone."""
    return str(error) if isinstance(error, UsageError) else describe(error)


class _Run:
    """The object of a one-shot rank: it runs the function it is given."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def run(self, work: Callable[..., Any], *args: Any) -> Any:
        return work(*args)


def run_on_ranks(config: TrainerConfig, work: Callable[..., Result], *args: Any) -> Result:
    """`work(*args)` on each of `config.world_size` new ranks; returns rank 0's result.
    `work` and `args` travel by pickle, so `work` is a module-level function."""
    ranks = LocalRanks(config, _Run)
    try:
        return ranks.call("run", work, *args)[0]
    finally:
        ranks.stop()
