"""`reinforge sft` on real parts: eval output of the tiny random model, the real tokenizer and
chat template, the real server and episode client, real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from reinforge.cli import main, sigterm_as_ctrl_c
from reinforge.config import Config, load_config
from reinforge.envs.registry import load_environment
from reinforge.errors import Interrupted
from reinforge.orchestrate import sft as orchestrate_sft
from reinforge.orchestrate.sft import sft_config, train_sft
from reinforge.policy.chat import ChatFormat
from reinforge.policy.client import PolicyClient
from reinforge.policy.config import EngineConfig, SamplingConfig
from reinforge.policy.engine import Engine
from reinforge.policy.engine_thread import Completion
from reinforge.policy.models import load_model, load_tokenizer
from reinforge.policy.records import masked_spans, render_messages
from reinforge.policy.sampling import SamplingParams
from reinforge.rollout.config import RolloutConfig
from reinforge.rollout.generator import generate_groups
from reinforge.rollout.store import read_trajectories
from reinforge.train.config import SFTConfig
from reinforge.train.sft import epoch_batches, load_data, to_example, train_batch
from reinforge.types import Status, Trajectory

from .commands import reinforge_here

TOOL_CALL = (
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
)


def evaluate(out: Path, max_tokens: int) -> Path:
    """Trajectories of the tiny model on 4 arithmetic tasks x 2, written by `reinforge eval`."""
    evaluated = reinforge_here(
        "eval", "arithmetic", "--model", "tiny-random", "--tasks", "4", "--rollouts", "2",
        "--max-tokens", str(max_tokens), "--out", str(out),
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    return out


def test_sft_on_eval_output_lowers_the_nll_and_writes_a_loadable_checkpoint(tmp_path):
    eval_dir = evaluate(tmp_path / "eval", max_tokens=16)
    trained = reinforge_here(
        "sft", "model.name=tiny-random", f"sft.data={eval_dir}",
        'sft.statuses=["ok", "truncated"]',  # a random model rarely ends its turn
        "sft.epochs=3", "sft.batch_size=4", "optim.lr=1e-3",
        f"run.dir={tmp_path}", "run.name=warm", "run.checkpoint_every=100",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "8 of 8 trajectories kept from 1 file(s), 0 rendered" in trained.stderr

    run = tmp_path / "warm"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["epoch"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert rows[-1]["train"]["nll"] < rows[0]["train"]["nll"]
    assert all(r["train"]["trained_tokens"] == 4 * 16 and r["train"]["grad_norm"] > 0 for r in rows)
    config = json.loads((run / "config.json").read_text())
    assert config["trainer"]["algorithm"]["loss"]["kind"] == "sft"
    assert config["run"]["steps"] == 6
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00006"]
    warmed = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_00006")
    start = dict(load_model("tiny-random")[0].named_parameters())
    unchanged = [n for n, p in warmed.named_parameters() if torch.equal(p, start[n])]
    assert unchanged == []

    # Token-exact records train on their own tokens, never re-tokenized.
    config = SFTConfig(data=[eval_dir], statuses=[Status.OK, Status.TRUNCATED])
    examples = load_data(config, load_tokenizer("tiny-random")).examples
    records = read_trajectories(eval_dir / "trajectories.jsonl")
    records.sort(key=lambda t: (t.task_id, t.group_id, t.index))  # the examples' order
    assert [(e.token_ids, e.loss_mask) for e in examples] == [
        (t.token_ids, t.loss_mask) for t in records
    ]


def test_a_resumed_run_trains_what_an_uninterrupted_one_does(tmp_path):
    eval_dir = evaluate(tmp_path / "eval", max_tokens=8)
    args = (
        "model.name=tiny-random", f"sft.data={eval_dir}", 'sft.statuses=["ok", "truncated"]',
        "sft.epochs=2", "sft.batch_size=4", "optim.lr=1e-3", "run.checkpoint_every=2",
        f"run.dir={tmp_path}",
    )  # fmt: skip
    assert reinforge_here("sft", *args, "run.name=whole").returncode == 0
    whole = tmp_path / "whole"
    # A crash after the step-2 checkpoint: the later checkpoint is gone, a step's metrics
    # line was written after it.
    crashed = tmp_path / "crashed"
    shutil.copytree(whole, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step_00004")
    lines = (crashed / "metrics.jsonl").read_text().splitlines()
    (crashed / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")

    again = reinforge_here("sft", *args, "run.name=crashed")
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = reinforge_here("sft", *args, "run.name=crashed", "--resume")
    assert resumed.returncode == 0, resumed.stderr

    def rows(run: Path) -> list[dict]:
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert [r["step"] for r in rows(crashed)] == [1, 2, 3, 4]
    for ours, theirs in zip(rows(crashed), rows(whole), strict=True):
        assert ours["train"]["nll"] == pytest.approx(theirs["train"]["nll"], rel=1e-5)
    final = [AutoModelForCausalLM.from_pretrained(r / "checkpoints" / "step_00004")
             for r in (whole, crashed)]  # fmt: skip
    for (name, a), b in zip(final[0].named_parameters(), final[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)


class ScriptedEngine(Engine):
    """The real engine's interface, answering with scripted text: the n-th assistant turn of
    an episode gets `replies[n]` in its canonical tokens and the EOS token. Unlike a random
    model's samples, these tokens are what rendering the text gives, so a messages-only
    record of the same conversation must come out token for token the same."""

    def __init__(self, replies: list[str]) -> None:
        model, tokenizer = load_model("tiny-random")
        super().__init__(model, tokenizer, "scripted", EngineConfig())
        self.replies = replies

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        turn = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        text = self.replies[turn]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return Completion(ids, [-1.0] * len(ids), [self.version] * len(ids), "stop")


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(load_tokenizer("tiny-random"))


async def _scripted(env_name: str, replies: list[str]) -> tuple[Trajectory, list[dict] | None]:
    env = load_environment(env_name)
    engine = ScriptedEngine(replies)
    client = PolicyClient.for_engine(engine, SamplingConfig())
    try:
        groups = await generate_groups(env, env.tasks(1, seed=3), client, RolloutConfig(), 1, None)
    finally:
        await client.close()
        engine.close()
    trajectory = groups[0].trajectories[0]
    assert trajectory.status is Status.OK and trajectory.turns == len(replies)
    assert trajectory.tools == env.harness.tool_schemas
    return trajectory, trajectory.tools


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def single_turn() -> tuple[Trajectory, list[dict] | None]:
    return await _scripted("arithmetic", ["The answer is 42."])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def with_tools() -> tuple[Trajectory, list[dict] | None]:
    return await _scripted("calculator", [TOOL_CALL, "<answer>408</answer>"])


def test_messages_render_to_the_token_exact_record_single_turn(single_turn, chat):
    record, tools = single_turn
    assert render_messages(record.messages, chat, tools) == (record.token_ids, record.loss_mask)


def test_messages_render_to_the_token_exact_record_with_tool_calls(with_tools, chat):
    record, tools = with_tools
    roles = [m["role"] for m in record.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert render_messages(record.messages, chat, tools) == (record.token_ids, record.loss_mask)
    # A server that parses tool calls returns them beside the text, not in it (what a
    # messages-only record from another OpenAI-compatible server holds): same tokens.
    external = [{**m, "content": None} if m.get("tool_calls") else m for m in record.messages]
    assert render_messages(external, chat, tools) == (record.token_ids, record.loss_mask)
    # The same, from a stored messages-only trajectory: its own `tools` give the prompt.
    stored = record.model_copy(update={"messages": external, "token_ids": [], "loss_mask": []})
    example = to_example("t", stored, chat.tokenizer, lambda: chat)
    assert example.rendered and (example.token_ids, example.loss_mask) == (
        record.token_ids,
        record.loss_mask,
    )


def test_the_mask_trains_exactly_the_assistant_turns_and_their_end(with_tools, chat):
    record, tools = with_tools
    ids, mask = render_messages(record.messages, chat, tools)
    spans = [chat.tokenizer.decode(ids[start:end]) for start, end in masked_spans(mask)]
    assert spans == [f"{TOOL_CALL}<|im_end|>", "<answer>408</answer><|im_end|>"]
    assert ids[-1] == chat.tokenizer.eos_token_id  # the record ends where the episode did
    # A truncated episode's last turn may have been cut mid-answer: its end is not taught.
    cut_ids, cut_mask = render_messages(record.messages, chat, tools, last_turn_ended=False)
    assert (cut_ids, cut_mask) == (ids[:-1], mask[:-1])


def test_a_token_record_in_another_vocabulary_is_rendered_from_its_messages(
    single_turn, chat, tmp_path
):
    record, _ = single_turn
    own = tmp_path / "own.jsonl"
    own.write_text(record.model_dump_json() + "\n")
    # The same conversation as a server of a model with another tokenizer would record it.
    foreign = record.model_copy(update={"token_ids": [t + 7 for t in record.token_ids]})
    other = tmp_path / "other.jsonl"
    other.write_text(foreign.model_dump_json() + "\n")
    [kept] = load_data(SFTConfig(data=[own]), chat.tokenizer).examples
    [rendered] = load_data(SFTConfig(data=[other]), chat.tokenizer).examples
    assert not kept.rendered and rendered.rendered
    assert (rendered.token_ids, rendered.loss_mask) == (record.token_ids, record.loss_mask)


def test_min_reward_and_status_filter_the_data(tmp_path):
    path = _write(tmp_path / "t.jsonl", [(0.0, "ok"), (0.5, "ok"), (1.0, "ok"), (1.0, "error")])
    tokenizer = load_tokenizer("tiny-random")
    kept = load_data(SFTConfig(data=[path], min_reward=0.5), tokenizer).examples
    assert [e.name.split(" ")[1] for e in kept] == ["t#1", "t#2"]
    everything = SFTConfig(data=[path], statuses=list(Status))
    assert len(load_data(everything, tokenizer).examples) == 4


def test_the_examples_do_not_depend_on_the_order_rollouts_were_written_in(tmp_path):
    """An eval writes rollouts as they finish: the same data in another order must give
    the same examples, so the same seed gives the same warm-up."""
    path = _write(tmp_path / "t.jsonl", [(1.0, "ok"), (0.9, "ok"), (0.8, "ok")])
    lines = path.read_text().splitlines(keepends=True)
    shuffled = tmp_path / "s.jsonl"
    shuffled.write_text("".join([lines[2], lines[0], lines[1]]))
    tokenizer = load_tokenizer("tiny-random")
    names = [
        [e.name.split(" ")[1] for e in load_data(SFTConfig(data=[f]), tokenizer).examples]
        for f in (path, shuffled)
    ]
    assert names == [["t#0", "t#1", "t#2"]] * 2


def test_nothing_kept_is_one_line_and_exit_2(tmp_path, capsys):
    path = _write(tmp_path / "t.jsonl", [(0.0, "ok"), (1.0, "error")])
    assert main(["sft", f"sft.data={path}", "sft.min_reward=1.0"]) == 2
    assert capsys.readouterr().err == (
        f"reinforge sft: error: no trajectories with status ok and reward >= 1.0 in {path}: "
        "0 of 2 kept\n"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sft.epochs=0"], "config sft.epochs: Input should be greater than or equal to 1"),
        (["sft.epoch=2"], "config sft.epoch: unknown key"),
        (['sft.statuses=["done"]'], "config sft.statuses.0: Input should be 'ok'"),
        (["sft.data=[]"], "sft.data is empty"),
        (["sft.data={tmp}/nope.jsonl"], "no such file or folder: {tmp}/nope.jsonl"),
        (["sft.data={tmp}"], "{tmp} holds neither trajectories.jsonl nor trajectories/*.jsonl"),
        (["sft.data={tmp}/bad.jsonl"], "{tmp}/bad.jsonl:2 is not a trajectory: Invalid JSON"),
        (["trainer.algorithm.loss.kl_coef=0.1"], "only aggregation applies"),
    ],
)
def test_config_and_data_errors_are_one_line_and_exit_2(overrides, message, tmp_path, capsys):
    good = _write(tmp_path / "ok.jsonl", [(1.0, "ok")])
    (tmp_path / "bad.jsonl").write_text(good.read_text() + "{not json\n")
    good.rename(tmp_path / "ok.json")  # the folder itself holds no trajectories.jsonl
    overrides = [o.format(tmp=tmp_path) for o in overrides]
    if not any(o.startswith("sft.data=") for o in overrides):
        overrides.insert(0, f"sft.data={tmp_path / 'ok.json'}")
    assert main(["sft", "model.name=tiny-random", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforge sft: error: ") and err.count("\n") == 1
    assert message.format(tmp=tmp_path) in err


def test_epochs_shuffle_deterministically_and_cover_every_example():
    first = epoch_batches(10, 4, seed=7, epoch=0)
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(i for b in first for i in b) == list(range(10))
    assert first == epoch_batches(10, 4, seed=7, epoch=0)
    assert first != epoch_batches(10, 4, seed=7, epoch=1)


def _write(path: Path, rewards_and_statuses: list[tuple[float, str]]) -> Path:
    """Token records of an empty assistant turn: `<|im_start|>` then the EOS token."""
    rows = [
        Trajectory(
            task_id="t",
            group_id="t",
            index=index,
            messages=[{"role": "assistant", "content": ""}],
            token_ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[-1.0],
            reward=reward,
            status=Status(status),
        )
        for index, (reward, status) in enumerate(rewards_and_statuses)
    ]
    path.write_text("".join(t.model_dump_json() + "\n" for t in rows))
    return path


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_lets_the_step_in_flight_finish_and_checkpoints_it(
    tmp_path, monkeypatch, sent
):
    eval_dir = evaluate(tmp_path / "eval", max_tokens=8)
    args = [
        "model.name=tiny-random", f"sft.data={eval_dir}", 'sft.statuses=["ok", "truncated"]',
        "sft.epochs=2", "sft.batch_size=4", f"run.dir={tmp_path}", "run.name=r",
    ]  # fmt: skip
    config = load_config(Config, None, args)
    examples = load_data(config.sft, load_tokenizer("tiny-random")).examples
    config = sft_config(config, len(examples))
    batches = []

    def ctrl_c_in_step_2(rows):  # the signal arrives as step 2 starts training
        batches.append(rows)
        if len(batches) == 2:
            os.kill(os.getpid(), sent)
        return train_batch(rows)

    monkeypatch.setattr(orchestrate_sft, "train_batch", ctrl_c_in_step_2)
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_as_ctrl_c() as terminated, pytest.raises(Interrupted) as stopped:
        train_sft(config, examples, lambda metrics: None)  # as the command line runs it
    assert terminated.is_set() == (sent == signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    assert str(stopped.value) == "step 2 finished, as it was training; checkpoint of step 2 saved"
    run = tmp_path / "r"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and [p.name for p in (run / "checkpoints").iterdir()] == ["step_00002"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C as before

    resumed = reinforge_here("sft", *args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
