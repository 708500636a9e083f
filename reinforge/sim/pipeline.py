"""The loop of `orchestrate/loop.py` played forward in simulated time: a discrete-event
simulation, deterministic for a workload (events at equal times run in the order they
were scheduled).

What it holds, part for part with the real loop:
- the rollout side (`RolloutSide`): starts groups in slot order while fewer than
  (bound + 1) steps of them are outstanding, and runs at most `rollout.concurrency`
  rollouts at once; a rollout is its turns, each decoded by one engine, with its
  environment time after each; a group is graded once all its rollouts are done, and
  waits for its slowest grade;
- the engines (`Engine`): continuous batching as the built-in engine does it. Each
  iteration admits waiting requests by the engine's own rule (`engine.admit`,
  `engine.max_batch`), prefills them (a new request gets its first token there and its
  second from the same iteration's decode), decodes one token for every running row, and
  retires the rows that finished. Its time is the profile's prefill of the new tokens plus
  its decode at that batch; after a weight update the running rows' states are computed
  again (a prefill of what they hold). Every token records the version that sampled it;
- the trainer (`Trainer`): takes the first `rollout.tasks_per_step` groups to finish,
  drops those holding a token more than the bound behind, sets aside up to
  `loop.uniform_redraws` uniform ones (the next tasks start in their slots), trains (the
  profile's time for the trained tokens), syncs, and releases the step's slots. The
  engines pause for the sync, and in partial mode for the whole step;
- a colocated layout shares devices between both sides: while both work (async), each
  runs slower by the profile's measured `sharing` factors.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque

from reinforge.sim.config import Layout, LoopShape
from reinforge.sim.events import Clock, SimGroup, SimRequest, SimRollout, SimStep
from reinforge.sim.profile import Profile
from reinforge.sim.trainer import Trainer
from reinforge.sim.workload import Workload


class Engine:
    """One sampler device's engine: an iteration at a time, never two at once."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rows: set[SimRequest] = set()
        self._ending: list[tuple[int, int, SimRequest]] = []
        """(last iteration, admission order, row): the rows by when they finish."""
        self._admitted = 0
        self.waiting: list[SimRequest] = []
        self.waited_steps = 0
        self.iteration = 0
        """Iterations finished."""
        self.running = False
        self.paused = False
        self.stale = False
        self.history: list[tuple[int, int]] = [(0, 0)]
        """(first iteration, policy version) of each weight version it sampled with."""
        self._busy_s = 0.0
        self._started = 0.0
        self._kick_due = False

    @property
    def load(self) -> int:
        return len(self.rows) + len(self.waiting)

    def submit(self, request: SimRequest) -> None:
        """Requests that arrive at the same moment (a group's rollouts) join the same
        iteration, as an idle engine gathers a burst before its prefill."""
        self.waiting.append(request)
        if not self._kick_due:
            self._kick_due = True
            self.sim.clock.after(0.0, self.kick)

    def update(self, version: int) -> None:
        """New weights from the next iteration on; running rows recompute their states."""
        self.history.append((self.iteration + self.running, version))
        self.stale = bool(self.rows)

    def kick(self) -> None:
        self._kick_due = False
        if not self.running and not self.paused and (self.rows or self.waiting):
            self._start()

    def _start(self) -> None:
        shape, profile = self.sim.shape, self.sim.profile
        seconds = 0.0
        if self.stale:  # states of older weights: computed again before the next token
            self.stale = False
            seconds += profile.prefill(sum(self._held(r) for r in self.rows))
        arrivals = self._admit(shape)
        if arrivals:
            # identical prompts (a group's first turns) are prefilled once
            prompts = {id(r.rollout.group): r.new_tokens for r in arrivals if r.rollout.turn == 0}
            later = sum(r.new_tokens for r in arrivals if r.rollout.turn > 0)
            seconds += profile.prefill(sum(prompts.values()) + later)
            for request in arrivals:
                request.first = self.iteration
                self.rows.add(request)
                self._admitted += 1
                heapq.heappush(self._ending, (request.last, self._admitted, request))
        # a one-token request is done after its prefill, before the decode
        decoding = len(self.rows) - sum(r.tokens == 1 for r in arrivals)
        if decoding:
            seconds += profile.decode(decoding) * self.sim.decode_factor()
        self._started = self.sim.clock.now
        self.running = True
        self.sim.trainer.rate_may_change()
        self.sim.clock.after(seconds, self._end)

    def _admit(self, shape: LoopShape) -> list[SimRequest]:
        """The built-in engine's admission rule, asked as the engine asks it."""
        room = shape.max_batch - len(self.rows)
        if shape.admit.admits(len(self.waiting), room, len(self.rows), self.waited_steps):
            arrivals, self.waiting = self.waiting[:room], self.waiting[room:]
            self.waited_steps = 0
            return arrivals
        if self.waiting:
            self.waited_steps += 1
        return []

    def busy_s(self) -> float:
        """Seconds spent in iterations so far, the one running counted up to now."""
        now = self.sim.clock.now
        return self._busy_s + (now - self._started if self.running else 0.0)

    def _end(self) -> None:
        self._busy_s += self.sim.clock.now - self._started
        done = self.iteration
        self.iteration += 1
        self.running = False
        while self._ending and self._ending[0][0] == done:
            request = heapq.heappop(self._ending)[2]
            self.rows.remove(request)
            request.rollout.versions.update(self._versions(request))
            self.sim.rollouts.turn_done(request)
        self.kick()
        if not self.running:
            self.sim.trainer.rate_may_change()

    def _held(self, row: SimRequest) -> int:
        """Tokens of the row's sequence so far: its earlier turns, about evenly sized."""
        cost = row.rollout.cost
        before = (cost.sequence_tokens - cost.prompt_tokens) * row.rollout.turn // cost.turns
        return cost.prompt_tokens + before + self.iteration - row.first + 1

    def _versions(self, request: SimRequest) -> Counter[int]:
        """Its tokens by the version of the iteration that sampled them."""
        counts: Counter[int] = Counter()
        bounds = [*self.history[1:], (request.last + 1, -1)]
        for (start, version), (end, _) in zip(self.history, bounds, strict=True):
            low, high = max(start, request.first), min(end - 1, request.last)
            if low > high:
                continue
            counts[version] += high - low + 1 + (low == request.first and request.tokens > 1)
        return counts


class RolloutSide:
    """Starts groups in slot order within the staleness bound and the concurrency limit."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        shape = sim.shape
        self.capacity = (shape.max_staleness + 1) * shape.tasks_per_step
        self.outstanding = 0
        self.next_slot = 0
        self.free = shape.concurrency
        self.queued: deque[SimRollout] = deque()
        self.in_flight = 0
        """Groups generating or grading: none means the rollout side is idle."""
        self.idle_since: float | None = 0.0
        self.idle_s = 0.0

    def release(self, groups: int) -> None:
        self.outstanding -= groups
        self.fill()

    def fill(self) -> None:
        while self.outstanding < self.capacity:
            self.outstanding += 1
            self._start_group(self.next_slot)
            self.next_slot += 1

    def take_idle_s(self) -> float:
        now = self.sim.clock.now
        if self.idle_since is not None:
            self.idle_s += now - self.idle_since
            self.idle_since = now
        idle, self.idle_s = self.idle_s, 0.0
        return idle

    def _start_group(self, slot: int) -> None:
        cost = self.sim.workload.group(slot)
        group = SimGroup(slot, cost, episodes_left=len(cost.rollouts))
        group.rollouts = [
            SimRollout(r, group, t) for r, t in zip(cost.rollouts, cost.trained, strict=True)
        ]
        if self.idle_since is not None:
            self.idle_s += self.sim.clock.now - self.idle_since
            self.idle_since = None
        self.in_flight += 1
        self.queued.extend(group.rollouts)
        self._run_queued()

    def _run_queued(self) -> None:
        while self.free and self.queued:
            self.free -= 1
            rollout = self.queued.popleft()
            rollout.engine = min(self.sim.engines, key=lambda e: e.load)
            self._submit_turn(rollout)

    def _submit_turn(self, rollout: SimRollout) -> None:
        turn, cost = rollout.turn, rollout.cost
        assert rollout.engine is not None
        request = SimRequest(rollout, cost.turn_tokens()[turn], cost.turn_prompt_tokens(turn))
        rollout.engine.submit(request)

    def turn_done(self, request: SimRequest) -> None:
        rollout = request.rollout
        env_s = rollout.cost.env_s / rollout.cost.turns
        self.sim.clock.after(env_s, lambda: self._after_env(rollout))

    def _after_env(self, rollout: SimRollout) -> None:
        rollout.turn += 1
        if rollout.turn < rollout.cost.turns:
            self._submit_turn(rollout)
            return
        self.free += 1
        self._run_queued()
        group = rollout.group
        group.episodes_left -= 1
        if group.episodes_left == 0:
            self.sim.clock.after(group.cost.grade_s, lambda: self._graded(group))

    def _graded(self, group: SimGroup) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle_since = self.sim.clock.now
        self.sim.trainer.offer(group)


class Simulation:
    def __init__(
        self,
        shape: LoopShape,
        layout: Layout,
        profile: Profile,
        workload: Workload,
        sync_s: float | None = None,
    ) -> None:
        self.shape = shape
        self.layout = layout
        self.profile = profile
        self.workload = workload
        self.sync_s = profile.sync_s if sync_s is None else sync_s
        self.clock = Clock()
        self.engines = [Engine(self) for _ in range(layout.samplers)]
        self.rollouts = RolloutSide(self)
        self.trainer = Trainer(self)

    def run(self, steps: int) -> list[SimStep]:
        self.rollouts.fill()
        self.clock.run(until=lambda: len(self.trainer.steps) >= steps)
        return self.trainer.steps

    def decode_factor(self) -> float:
        """A decode step's slowdown while the trainer trains on the same devices."""
        if self.layout.colocated and self.trainer.training:
            return self.profile.sharing.decode
        return 1.0

    def pause_engines(self, paused: bool) -> None:
        for engine in self.engines:
            engine.paused = paused
            engine.kick()
