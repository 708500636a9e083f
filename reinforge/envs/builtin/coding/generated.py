"""Generated training tasks: the easy tier's kinds of file work (edit a setting, append,
delete or create lines, copy, move, rename, make a folder), drawn from a seed.

A small model given one reference transcript per written task memorises those
transcripts; given hundreds of variants of the same kinds (other files, keys, values and
wordings) it has to learn the operation. The generated tasks are Harbor task directories
like the written ones (a Dockerfile of COPY lines, hidden tests, `solution/solve.sh`), so
they are graded, audited and replayed by the oracle the same way; they only ever join a
train split, so the held-out tasks stay the written ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

WORKDIR = "/app"

TASK_TOML = """schema_version = "1.1"

[metadata]
difficulty = "easy"
category = "{kind}"
tags = ["generated"]

[agent]
timeout_sec = 300.0

[verifier]
timeout_sec = 60.0

[environment]
cpus = 1
memory_mb = 512
storage_mb = 256
"""

TEST_SH = """#!/bin/bash
# Hidden tests, copied in after the agent phase.
if python3 -I /tests/test_task.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

TEST_PY = """import os
import unittest

FILES = {files!r}
ABSENT = {absent!r}
EMPTY_DIRS = {empty_dirs!r}


class Outcome(unittest.TestCase):
    def test_files(self):
        # Compared line by line (trailing spaces and blank lines at the end do not count).
        for path, expected in FILES.items():
            self.assertFalse(os.path.islink(path), path)
            with open(path) as f:
                lines = [line.rstrip() for line in f.read().splitlines()]
            while lines and not lines[-1]:
                lines.pop()
            self.assertEqual(lines, expected, path)

    def test_absent(self):
        for path in ABSENT:
            self.assertFalse(os.path.lexists(path), path)

    def test_empty_dirs(self):
        for path in EMPTY_DIRS:
            self.assertTrue(os.path.isdir(path) and not os.path.islink(path), path)
            self.assertEqual(os.listdir(path), [], path)


if __name__ == "__main__":
    unittest.main()
"""


@dataclass
class Spec:
    """One generated task: what the agent is told, what it finds, what must hold after."""

    kind: str
    instruction: str
    files: dict[str, list[str]]
    """The starting files (relative to the workdir), as lines."""
    solution: str
    expected: dict[str, list[str]]
    absent: list[str] = field(default_factory=list)
    empty_dirs: list[str] = field(default_factory=list)


WORDS = (
    "alpha amber apple aspen birch cedar cobalt copper coral delta ember falcon fern "
    "garnet harbor hazel indigo ivory jade juniper kestrel lemon linen maple marble "
    "meadow nickel olive onyx orchid pebble pine quartz raven river saffron sage "
    "silver slate spruce summit thistle topaz tulip umber velvet willow zephyr"
).split()
KEYS = (
    "port timeout retries workers threads mode region owner theme color limit "
    "replicas version channel backend cache_size batch_size max_users log_level"
).split()
STEMS = "app config settings service server db worker cache deploy site build".split()
NAMES = "notes report todo readme changelog summary draft plan log list".split()
TEXT_EXTS = ".txt .md .log .csv".split()


@dataclass
class Format:
    """A config file format: how a key and its value make a line."""

    ext: str
    line: Callable[[str, str], str]
    head: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


FORMATS = [
    Format(".properties", lambda k, v: f"{k}={v}"),
    Format(".env", lambda k, v: f"{k.upper()}={v}"),
    Format(".ini", lambda k, v: f"{k} = {v}", head=["[main]"]),
    Format(".yaml", lambda k, v: f"{k}: {v}"),
    Format(".toml", lambda k, v: f"{k} = {v}", head=["[tool]"]),
    Format(".json", lambda k, v: f'  "{k}": {v},', head=["{"], tail=["}"]),
]


def _value(rng: random.Random, like: str = "") -> str:
    """A number or a word; with `like`, another value of its kind (so a TOML or JSON file
    stays valid)."""
    numeric = like.isdigit() if like else rng.random() < 0.6
    while True:
        value = str(rng.randint(2, 9999)) if numeric else rng.choice(WORDS)
        if value != like.strip('"'):
            return f'"{value}"' if like.startswith('"') else value


def _config(
    rng: random.Random, formats: list[Format] = FORMATS
) -> tuple[Format, str, list[tuple[str, str]]]:
    """A config file: its format, its name and 3-5 settings."""
    fmt = rng.choice(formats)
    name = ".env" if fmt.ext == ".env" else rng.choice(STEMS) + fmt.ext
    keys = rng.sample(KEYS, rng.randint(3, 5))
    values = [_value(rng) for _ in keys]
    if fmt.ext in (".json", ".toml"):  # strings are quoted there
        values = [v if v.isdigit() else f'"{v}"' for v in values]
    return fmt, name, list(zip(keys, values, strict=True))


def _render(fmt: Format, settings: list[tuple[str, str]]) -> list[str]:
    lines = [fmt.line(k, v) for k, v in settings]
    if fmt.ext == ".json":
        lines[-1] = lines[-1].rstrip(",")
    return fmt.head + lines + fmt.tail


def _text_lines(rng: random.Random) -> list[str]:
    return [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(rng.randint(1, 4))]


def _script(*commands: str) -> str:
    return "#!/bin/bash\nset -e\ncd /app\n" + "\n".join(commands) + "\n"


def _path(name: str) -> str:
    return f"{WORKDIR}/{name}"


def _say(rng: random.Random, wordings: list[str], **fields: str) -> str:
    """One of a kind's wordings, filled in: the model has to learn the operation, not a
    sentence."""
    return rng.choice(wordings).format(**fields)


def edit(rng: random.Random) -> Spec:
    fmt, name, settings = _config(rng)
    i = rng.randrange(len(settings))
    key, old = settings[i]
    new = _value(rng, like=old)
    shown_key = key.upper() if fmt.ext == ".env" else key
    before = _render(fmt, settings)
    after = _render(fmt, settings[:i] + [(key, new)] + settings[i + 1 :])
    old_line, new_line = before[i + len(fmt.head)].strip(), after[i + len(fmt.head)].strip()
    wordings = [
        "In `{p}`, change `{k}` from `{o}` to `{n}`. Keep the other lines as they are.",
        "Set `{k}` to `{n}` in `{p}` (it is `{o}` now). Leave everything else unchanged.",
        "`{p}` has `{k}` set to `{o}`. Change it to `{n}` and keep the rest of the file.",
    ]
    instruction = _say(rng, wordings, p=_path(name), k=shown_key, o=old, n=new)
    return Spec(
        "edit-config",
        instruction,
        {name: before},
        _script(f"sed -i 's/{old_line.rstrip(',')}/{new_line.rstrip(',')}/' {name}"),
        {name: after},
    )


def delete(rng: random.Random) -> Spec:
    # One setting per line, no brackets or trailing commas to keep right.
    fmt, name, settings = _config(rng, [f for f in FORMATS if not f.head])
    i = rng.randrange(len(settings))
    shown_key = settings[i][0].upper() if fmt.ext == ".env" else settings[i][0]
    line = fmt.line(*settings[i])
    wordings = [
        "Remove the line that sets `{k}` from `{p}`. Keep every other line.",
        "Delete the `{k}` setting from `{p}`; the other lines stay as they are.",
    ]
    instruction = _say(rng, wordings, p=_path(name), k=shown_key)
    return Spec(
        "delete-line",
        instruction,
        {name: _render(fmt, settings)},
        _script(f"sed -i '/^{line}$/d' {name}"),
        {name: _render(fmt, settings[:i] + settings[i + 1 :])},
    )


def append(rng: random.Random) -> Spec:
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    lines = _text_lines(rng)
    added = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    wordings = [
        "Add the line `{l}` at the end of `{p}`.",
        "Append a new last line `{l}` to `{p}`, keeping the lines already there.",
    ]
    instruction = _say(rng, wordings, p=_path(name), l=added)
    return Spec(
        "append-line",
        instruction,
        {name: lines},
        _script(f"echo '{added}' >> {name}"),
        {name: [*lines, added]},
    )


def create(rng: random.Random) -> Spec:
    if rng.random() < 0.5:
        fmt, name, settings = _config(rng)
        lines = _render(fmt, settings)
    else:
        name, lines = rng.choice(NAMES) + rng.choice(TEXT_EXTS), _text_lines(rng)
    if len(lines) == 1 and rng.random() < 0.5:
        instruction = f"Create a file `{_path(name)}` whose only line is `{lines[0]}`."
    else:
        block = "\n".join(f"    {line}" for line in lines)
        instruction = f"Create `{_path(name)}` with exactly these lines:\n\n{block}\n"
    return Spec(
        "create-file",
        instruction,
        {},
        _script(f"cat > {name} <<'EOF'", *lines, "EOF"),
        {name: lines},
    )


def copy(rng: random.Random) -> Spec:
    name = rng.choice(NAMES + STEMS) + rng.choice(TEXT_EXTS + [".conf", ".ini"])
    target = rng.choice([f"{name}.bak", f"{name}.orig", f"backup-{name}"])
    lines = _text_lines(rng)
    wordings = [
        "Make a copy of `{p}` named `{t}`. Both files must have the original content.",
        "Back up `{p}` as `{t}`; keep the original where it is.",
    ]
    instruction = _say(rng, wordings, p=_path(name), t=_path(target))
    return Spec(
        "copy-file",
        instruction,
        {name: lines},
        _script(f"cp {name} {target}"),
        {name: lines, target: lines},
    )


def make_dir(rng: random.Random) -> Spec:
    folder = rng.choice(["", "data/", "src/", "var/"]) + rng.choice(WORDS + STEMS)
    wordings = ["Create an empty directory `{d}`.", "Make a new, empty folder `{d}`."]
    instruction = _say(rng, wordings, d=_path(folder))
    return Spec(
        "make-dir", instruction, {}, _script(f"mkdir -p {folder}"), {}, empty_dirs=[_path(folder)]
    )


def move(rng: random.Random) -> Spec:
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    folder = rng.choice(["docs", "archive", "old", "notes", "reports", "backup"])
    lines = _text_lines(rng)
    wordings = [
        "Move `{p}` into a new directory `{d}`, keeping its name.",
        "Put `{p}` in a new folder `{d}` (same file name); `{p}` must be gone after.",
    ]
    instruction = _say(rng, wordings, p=_path(name), d=_path(folder))
    return Spec(
        "move-file",
        instruction,
        {name: lines},
        _script(f"mkdir -p {folder}", f"mv {name} {folder}/"),
        {f"{folder}/{name}": lines},
        absent=[_path(name)],
    )


def rename(rng: random.Random) -> Spec:
    stem, ext = rng.choice(NAMES), rng.choice(TEXT_EXTS)
    name = stem + ext
    target = rng.choice(
        [stem + e for e in TEXT_EXTS if e != ext] + [f"{stem}-{rng.choice(WORDS)}{ext}"]
    )
    lines = _text_lines(rng)
    wordings = [
        "Rename `{p}` to `{t}`.",
        "Give `{p}` the new name `{t}`; its content stays the same.",
    ]
    instruction = _say(rng, wordings, p=_path(name), t=_path(target))
    return Spec(
        "rename-file",
        instruction,
        {name: lines},
        _script(f"mv {name} {target}"),
        {target: lines},
        absent=[_path(name)],
    )


KINDS: dict[str, Callable[[random.Random], Spec]] = {
    kind.__name__.replace("_", "-"): kind
    for kind in (edit, delete, append, create, copy, make_dir, move, rename)
}


def write_task(spec: Spec, path: Path) -> None:
    """`spec` as a Harbor task directory at `path`."""
    (path / "environment").mkdir(parents=True)
    (path / "solution").mkdir()
    (path / "tests").mkdir()
    (path / "task.toml").write_text(TASK_TOML.format(kind=spec.kind))
    (path / "instruction.md").write_text(spec.instruction.rstrip() + "\n")
    dockerfile = ["FROM python:3.11-slim", f"WORKDIR {WORKDIR}"]
    for name, lines in spec.files.items():
        (path / "environment" / name).write_text("\n".join(lines) + "\n")
        dockerfile.append(f"COPY {name} {_path(name)}")
    (path / "environment" / "Dockerfile").write_text("\n".join(dockerfile) + "\n")
    (path / "solution" / "solve.sh").write_text(spec.solution)
    (path / "tests" / "test.sh").write_text(TEST_SH)
    files = {_path(name): lines for name, lines in spec.expected.items()}
    test = TEST_PY.format(files=files, absent=spec.absent, empty_dirs=spec.empty_dirs)
    (path / "tests" / "test_task.py").write_text(test)


def generate(n: int, seed: int, root: Path, kinds: Sequence[str] = tuple(KINDS)) -> list[Path]:
    """`n` task directories under `root`, the `kinds` taken in turn, drawn from `seed`."""
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        path = root / f"generated-{kind}-{i:04d}"
        write_task(KINDS[kind](rng), path)
        paths.append(path)
    return paths
