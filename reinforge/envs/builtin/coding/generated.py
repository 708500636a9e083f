"""Generated training tasks: the easy tier's kinds of file work (edit a setting, append,
delete or create lines, copy, move, rename, make a folder) and of one-line Python fixes (a
wrong operator, a typo in a message, a print that should be a return, a body to write),
drawn from a seed.

A small model given one reference transcript per written task memorises those
transcripts; given hundreds of variants of the same kinds (other files, keys, values and
wordings) it has to learn the operation. The generated tasks are Harbor task directories
like the written ones (a Dockerfile of COPY lines, hidden tests, `solution/solve.sh`), so
they are graded, audited and replayed by the oracle the same way; they only ever join a
train split, so the held-out tasks stay the written ones.
"""

from __future__ import annotations

import random
import re
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


FUNCTION_TEST_PY = """import ast
import subprocess
import sys
import unittest


def unprivileged():
    # Run the candidate as nobody where the sandbox maps that uid: its code then can
    # neither write the reward file nor signal the processes that grade it.
    with open("/proc/self/uid_map") as f:
        ranges = [line.split() for line in f]
    if any(int(inside) <= 65534 < int(inside) + int(n) for inside, _, n in ranges):
        return {"user": 65534, "group": 65534, "extra_groups": []}
    return {}


def evaluate(module, expression):
    # The repr of `expression`, computed in a fresh process that imports the candidate's
    # module from /app after the standard library: its code never runs in this process.
    script = "import sys\\nsys.path.append('/app')\\n"
    script += "import " + module + "\\nprint(repr(" + expression + "))"
    result = subprocess.run(
        [sys.executable, "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/tmp",
        **unprivileged(),
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise AssertionError(f"exit code {result.returncode}: {result.stderr[-500:]}")
    return lines[-1]


MODULE = %(module)r
CALLS = %(calls)r
EXPECTED = %(expected)r


class Outcome(unittest.TestCase):
    def test_calls(self):
        got = ast.literal_eval(evaluate(MODULE, "[" + ", ".join(CALLS) + "]"))
        self.assertIs(type(got), list)
        self.assertEqual(got, EXPECTED)
        self.assertEqual([type(g) for g in got], [type(e) for e in EXPECTED])


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
    calls: dict[str, object] = field(default_factory=dict)
    """For a Python task, calls into the agent's module (`module.function(args)`) and the
    value each must return; the files are then not compared."""


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
    old_line, new_line = (
        before[i + len(fmt.head)].strip(),
        after[i + len(fmt.head)].strip(),
    )
    wordings = [
        "In `{p}`, change `{k}` from `{o}` to `{n}`. Keep the other lines as they are.",
        "Set `{k}` to `{n}` in `{p}` (it is `{o}` now). Leave everything else unchanged.",
        "`{p}` has `{k}` set to `{o}`. Change it to `{n}` and keep the rest of the file.",
        # Without the old value the agent has to read the file to find the line.
        "In `{p}`, set `{k}` to `{n}`. Keep every other setting exactly as it is.",
        "Change `{k}` in `{p}` to `{n}`; the other lines stay as they are.",
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
    form = rng.random()
    if form < 0.5:
        fmt, name, settings = _config(rng)
        if form < 0.25:
            lines, instruction = _described(rng, fmt, name, settings)
        else:
            lines = _render(fmt, settings)
            instruction = _listed(rng, name, lines)
    else:
        name, lines = rng.choice(NAMES) + rng.choice(TEXT_EXTS), _text_lines(rng)
        instruction = _listed(rng, name, lines)
    return Spec("create-file", instruction, {}, _heredoc(name, lines), {name: lines})


def _listed(rng: random.Random, name: str, lines: list[str]) -> str:
    """An instruction that gives the file's lines as they must be."""
    if len(lines) == 1 and rng.random() < 0.5:
        return f"Create a file `{_path(name)}` whose only line is `{lines[0]}`."
    block = "\n".join(f"    {line}" for line in lines)
    return f"Create `{_path(name)}` with exactly these lines:\n\n{block}\n"


SECTIONS = {".ini": ("an INI file", "section"), ".toml": ("a TOML file", "table")}


def _described(
    rng: random.Random, fmt: Format, name: str, settings: list[tuple[str, str]]
) -> tuple[list[str], str]:
    """A config file's lines and an instruction that describes them instead of listing
    them, as people ask: the agent has to lay out the section, the JSON object or the
    lines itself."""
    path = _path(name)
    if fmt.ext == ".json":
        obj = "{" + ", ".join(f'"{k}": {v}' for k, v in settings) + "}"
        return [obj], f"Create a file `{path}` that contains this JSON object:\n\n    {obj}\n"
    shown = [fmt.line(k, v) for k, v in settings]
    listed = ", ".join(f"`{line}`" for line in shown[:-1]) + f" and `{shown[-1]}`"
    if fmt.ext in SECTIONS:
        what, part = SECTIONS[fmt.ext]
        section = rng.choice(STEMS + KEYS)
        wordings = [
            "Create {w} `{p}` with one {t}, `[{s}]`, that sets {l}.",
            "Write {w} `{p}` holding a single {t} `[{s}]` with the settings {l}.",
        ]
        instruction = _say(rng, wordings, w=what, p=path, t=part, s=section, l=listed)
        return [f"[{section}]", *shown], instruction
    return (
        shown,
        f"Create `{path}` that sets {listed}, one setting per line in this order.",
    )


def _heredoc(name: str, lines: list[str]) -> str:
    return _script(f"cat > {name} <<'EOF'", *lines, "EOF")


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
    if rng.random() < 0.5:
        wordings = [
            "Create an empty directory `{d}`.",
            "Make a new, empty folder `{d}`.",
        ]
        instruction = _say(rng, wordings, d=_path(folder))
        script = _script(f"mkdir -p {folder}")
        return Spec("make-dir", instruction, {}, script, {}, empty_dirs=[_path(folder)])
    name = rng.choice(NAMES) + rng.choice(TEXT_EXTS)
    line = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
    wordings = [
        "Create a directory `{d}` and in it a file `{f}` whose only line is `{l}`.",
        "Make a new folder `{d}` holding one file, `{f}`, with the single line `{l}`.",
    ]
    instruction = _say(rng, wordings, d=_path(folder), f=name, l=line)
    script = _script(f"mkdir -p {folder}", f"echo '{line}' > {folder}/{name}")
    return Spec("make-dir", instruction, {}, script, {f"{folder}/{name}": [line]})


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


MODULES = "helpers ops maths util tools core compute shapes scores".split()


def _module(rng: random.Random) -> tuple[str, str]:
    module = rng.choice(MODULES)
    return module, f"{module}.py"


def _ints(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(n)]


OPERATORS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}


def fix_operator(rng: random.Random) -> Spec:
    module, name = _module(rng)
    fn = rng.choice("combine merge mix apply blend join pair fold".split())
    right, wrong = rng.sample(list(OPERATORS), 2)
    x, y = rng.randint(2, 9), rng.randint(2, 9)
    wordings = [
        "The function `{f}(a, b)` in `{p}` should return `a {r} b`, but it uses the wrong "
        "operator: `{f}({x}, {y})` returns `{w}` instead of `{e}`. Fix it.",
        "`{f}(a, b)` in `{p}` returns `a {o} b` where it should return `a {r} b`. Fix the "
        "operator and keep the function's name and arguments.",
    ]
    instruction = _say(
        rng,
        wordings,
        f=fn,
        p=_path(name),
        r=right,
        o=wrong,
        x=str(x),
        y=str(y),
        w=str(OPERATORS[wrong](x, y)),
        e=str(OPERATORS[right](x, y)),
    )
    pairs = [(x, y), *zip(_ints(rng, 3), _ints(rng, 3), strict=True)]
    pattern = wrong.replace("*", "\\*")  # sed's regex: a literal star
    return Spec(
        "fix-operator",
        instruction,
        {name: [f"def {fn}(a, b):", f"    return a {wrong} b"]},
        _script(f"sed -i 's/return a {pattern} b/return a {right} b/' {name}"),
        {},
        calls={f"{module}.{fn}({a}, {b})": OPERATORS[right](a, b) for a, b in pairs},
    )


GREETINGS = "Hello Goodbye Thanks Congratulations Cheers Greetings Farewell".split()


def fix_typo(rng: random.Random) -> Spec:
    module = rng.choice("texts words replies phrases".split())
    name = f"{module}.py"
    fn = rng.choice("greet farewell message salute hail".split())
    word = rng.choice(GREETINGS)
    i = rng.randrange(1, len(word))
    typo = word[:i] + word[i + 1 :]
    who = rng.choice("Sam Ann Bo Kim Lee Max Eve".split())
    wordings = [
        'The function `{f}(name)` in `{p}` has a typo: `{f}("{n}")` returns `"{t}, {n}!"`. '
        'Fix the typo so that it returns `"{c}, {n}!"`.',
        '`{f}("{n}")` in `{p}` gives `"{t}, {n}!"` but should give `"{c}, {n}!"`. Correct '
        "the spelling.",
    ]
    instruction = _say(rng, wordings, f=fn, p=_path(name), n=who, t=typo, c=word)
    names = [who, *rng.sample("Zoe Tom Ivy Ray Liz Ned".split(), 2)]
    return Spec(
        "fix-typo",
        instruction,
        {name: [f"def {fn}(name):", f'    return "{typo}, " + name + "!"']},
        _script(f"sed -i 's/\"{typo}, /\"{word}, /' {name}"),
        {},
        calls={f"{module}.{fn}({n!r})": f"{word}, {n}!" for n in names},
    )


AGGREGATES = {
    "sum": ("the sum", "sum_of add_all".split()),
    "max": ("the largest", "largest biggest top".split()),
    "min": ("the smallest", "smallest lowest bottom".split()),
    "len": ("the length", "count size_of how_many".split()),
}


def return_not_print(rng: random.Random) -> Spec:
    module, name = _module(rng)
    agg = rng.choice(list(AGGREGATES))
    what, fns = AGGREGATES[agg]
    fn, arg = rng.choice(fns), rng.choice("values items numbers".split())
    example = _ints(rng, 3)
    wordings = [
        "The function `{f}({a})` in `{p}` prints {w} of `{a}` instead of returning it, so "
        "`{f}({x})` returns `None`. Change it so that it returns it (`{f}({x})` is `{r}`).",
        "`{f}({a})` in `{p}` should return {w} of `{a}`, but it prints it and returns "
        "`None`. Make it return the value: `{f}({x})` must be `{r}`.",
    ]
    value = {"sum": sum, "max": max, "min": min, "len": len}[agg]
    instruction = _say(
        rng,
        wordings,
        f=fn,
        a=arg,
        p=_path(name),
        w=what,
        x=str(example),
        r=str(value(example)),
    )
    lists = [example, _ints(rng, 4), _ints(rng, 2)]
    return Spec(
        "return-not-print",
        instruction,
        {name: [f"def {fn}({arg}):", f"    print({agg}({arg}))"]},
        _script(f"sed -i 's/print({agg}({arg}))/return {agg}({arg})/' {name}"),
        {},
        calls={f"{module}.{fn}({xs!r})": value(xs) for xs in lists},
    )


def implement(rng: random.Random) -> Spec:
    module, name = _module(rng)
    fn = rng.choice("scale shift bump grow offset step adjust convert".split())
    op, k = rng.choice(list(OPERATORS)), rng.randint(2, 9)
    x = rng.randint(2, 9)
    wordings = [
        "Implement `{f}(x)` in `{p}`: it returns `x {o} {k}`. For example `{f}({x})` is `{r}`.",
        "`{f}(x)` in `{p}` is not written yet. Make it return `x {o} {k}` (so `{f}({x})` "
        "is `{r}`).",
    ]
    result = OPERATORS[op](x, k)
    instruction = _say(rng, wordings, f=fn, p=_path(name), o=op, k=str(k), x=str(x), r=str(result))
    xs = [x, *_ints(rng, 3)]
    return Spec(
        "implement",
        instruction,
        {name: [f"def {fn}(x):", "    raise NotImplementedError"]},
        _script(f"sed -i 's/raise NotImplementedError/return x {op} {k}/' {name}"),
        {},
        calls={f"{module}.{fn}({v})": OPERATORS[op](v, k) for v in xs},
    )


KINDS: dict[str, Callable[[random.Random], Spec]] = {
    kind.__name__.replace("_", "-"): kind
    for kind in (
        *(edit, delete, append, create, copy, make_dir, move, rename),
        *(fix_operator, fix_typo, return_not_print, implement),
    )
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
    if spec.calls:
        module = next(iter(spec.calls)).split(".")[0]
        calls, expected = list(spec.calls), list(spec.calls.values())
        test = FUNCTION_TEST_PY % {
            "module": module,
            "calls": calls,
            "expected": expected,
        }
    else:
        files = {_path(name): lines for name, lines in spec.expected.items()}
        test = TEST_PY.format(files=files, absent=spec.absent, empty_dirs=spec.empty_dirs)
    (path / "tests" / "test_task.py").write_text(test)


NAMED = re.compile(r"`(/[^`\s]+)`|`([A-Za-z_]\w*)\(")
"""What an instruction names: an absolute path, or a function called, in backticks."""


def named(instruction: str) -> set[str]:
    return {path or function for path, function in NAMED.findall(instruction)}


def generate(
    n: int,
    seed: int,
    root: Path,
    kinds: Sequence[str] = tuple(KINDS),
    avoid: frozenset[str] = frozenset(),
) -> list[Path]:
    """`n` task directories under `root`, the `kinds` taken in turn, drawn from `seed`.

    A draw whose instruction names a path or function in `avoid` (those the written tasks
    name) is drawn again: a generated task is another task of the same kind, never a
    written one with other values, so a held-out task is never trained on in disguise."""
    rng = random.Random(seed)
    paths = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        spec = KINDS[kind](rng)
        while named(spec.instruction) & avoid:
            spec = KINDS[kind](rng)
        path = root / f"generated-{kind}-{i:04d}"
        write_task(spec, path)
        paths.append(path)
    return paths
