"""The note a command prints when bf16 would run emulated on this machine's CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reinforge.policy.bf16 import bf16_warning, native_bf16

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f\nprocessor\t: 1\n"
AVX512_BF16 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
AMX = "flags\t\t: fpu avx2 amx_tile amx_bf16 amx_int8\n"
ARM = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm\n"
ARM_OLD = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"


def cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "native"),
    [(AVX2, False), (AVX512_BF16, True), (AMX, True), (ARM, True), (ARM_OLD, False)],
    ids=["avx2", "avx512_bf16", "amx", "arm-bf16", "arm-without"],
)
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, text, native):
    assert native_bf16(cpuinfo(tmp_path, text)) is native


def test_unreadable_flags_say_nothing(tmp_path):
    assert native_bf16(tmp_path / "missing") is None
    assert native_bf16(cpuinfo(tmp_path, "processor\t: 0\n")) is None
    keys = {"trainer.precision": "bfloat16"}
    assert bf16_warning(keys, tmp_path / "missing") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the note is for CPUs alone")
def test_the_note_names_the_keys_set_to_bf16_on_a_cpu_without_it(tmp_path):
    without, with_ = cpuinfo(tmp_path, AVX2), tmp_path / "with"
    with_.write_text(AMX)
    keys = {"trainer.precision": "bfloat16", "engine.dtype": "auto"}
    note = bf16_warning(keys, without)
    assert note is not None and note.startswith("note: trainer.precision = bfloat16")
    assert "engine.dtype" not in note
    both = bf16_warning({**keys, "engine.dtype": "bfloat16"}, without)
    assert both is not None and "trainer.precision and engine.dtype = bfloat16" in both
    assert bf16_warning(keys, with_) is None
    assert bf16_warning({"trainer.precision": "float32"}, without) is None


def test_a_command_starts_with_its_threads_then_the_note_where_due(monkeypatch):
    from reinforge.policy import threads

    asked: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)  # recorded, not set
    assert threads.prepare_cpu(1, {}) == ["threads: 1 (model.threads)"]
    keys = {"engine.dtype": "bfloat16"}
    note = bf16_warning(keys)  # this machine's own CPU, as the command's
    assert threads.prepare_cpu(2, keys) == ["threads: 2 (model.threads)", *([note] if note else [])]
    assert asked == [1, 2]
