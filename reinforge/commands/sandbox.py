"""`reinforge sandbox run` and `reinforge sandbox bench`: thin commands over the library."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from reinforge.errors import UsageError

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
SANDBOX_FAILED_EXIT_CODE = 125  # `docker run`'s code for "the container could not run"


def parse_size(text: str) -> int:
    """'256M' -> bytes. Binary units (K, M, G), case-insensitive, optional 'B'/'iB'."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in ("K", "M", "G") else ""
    number = value[: len(value) - len(unit)]
    try:
        size = int(float(number) * SIZE_UNITS[unit])
    except ValueError:
        raise UsageError(f"not a size: {text!r} (use e.g. 256M or 1G)") from None
    if size <= 0:
        raise UsageError(f"size must be positive: {text!r}")
    return size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="sandbox_command", required=True, metavar="SUBCOMMAND")

    run = commands.add_parser(
        "run",
        help="run CMD in a fresh local sandbox and exit with its exit code (124 on timeout)",
        usage="reinforge sandbox run [options] -- CMD...",
    )
    run.add_argument(
        "--network",
        choices=("off", "on"),
        default="off",
        help="'on' shares the host network (including its loopback services)",
    )
    run.add_argument("--memory", default="1G", help="memory limit, e.g. 256M (default 1G)")
    run.add_argument("--disk", default="512M", help="writable /workspace + /tmp size (512M)")
    run.add_argument("--pids", type=int, default=256, help="process limit (default 256)")
    run.add_argument("--cpus", type=float, default=1.0, help="CPU limit in cores (default 1)")
    run.add_argument("--timeout", type=float, default=None, help="seconds before a kill")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    run.set_defaults(func=run_command)

    bench = commands.add_parser("bench", help="measure create/exec/pause/upload latencies")
    bench.add_argument("--n", type=int, default=32, help="sandboxes per measurement (32)")
    bench.add_argument("--json", type=Path, default=None, help="also write results here")
    bench.set_defaults(func=bench_command)


def run_command(args: argparse.Namespace) -> int:
    from reinforge.sandbox.local import LocalProvider
    from reinforge.sandbox.protocol import SandboxError, SandboxSpec

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given: reinforge sandbox run -- CMD...")
    if args.pids < 1 or args.cpus <= 0 or (args.timeout is not None and args.timeout <= 0):
        raise UsageError("--pids, --cpus and --timeout must be positive")
    spec = SandboxSpec(
        memory_bytes=parse_size(args.memory),
        disk_bytes=parse_size(args.disk),
        pids=args.pids,
        cpus=args.cpus,
        network=args.network,
    )

    def stream(name: str, chunk: bytes) -> None:
        out = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        out.write(chunk)
        out.flush()

    async def main() -> int:
        provider = LocalProvider()
        try:
            sandbox = await provider.create(spec)
            async with sandbox:
                result = await sandbox.exec(
                    cmd, timeout=args.timeout, max_output_bytes=0, on_output=stream
                )
        finally:
            await provider.aclose()
        if result.timed_out:
            print(f"reinforge sandbox: timed out after {args.timeout:g} s", file=sys.stderr)
        return result.exit_code

    try:
        return asyncio.run(main())
    except SandboxError as error:  # the sandbox failed, not the command: like `docker run`
        print(f"reinforge sandbox: {error}", file=sys.stderr)
        return SANDBOX_FAILED_EXIT_CODE


def bench_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from reinforge.sandbox.bench import run_bench
    from reinforge.sandbox.local import LocalProvider

    if args.n < 1:
        raise UsageError("--n must be at least 1")

    async def main() -> dict:
        provider = LocalProvider()
        try:
            return await run_bench(provider, args.n)
        finally:
            await provider.aclose()

    results = asyncio.run(main())
    table = Table(title=f"local sandbox latency (n={args.n}), milliseconds")
    for column in ("measurement", "p50", "p99"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    rows = (
        ("create -> first exec -> destroy, sequential", "create_exec_destroy"),
        (f"create -> first exec -> destroy, {args.n} concurrent", "concurrent_create_exec_destroy"),
        ("exec round-trip (`true`)", "exec"),
        ("pause (freeze)", "pause"),
        ("resume (thaw)", "resume"),
    )
    for label, key in rows:
        table.add_row(label, f"{results[key + '_p50_ms']:.1f}", f"{results[key + '_p99_ms']:.1f}")
    total = f"{results['concurrent_total_ms']:.0f}"
    table.add_row(f"all {args.n} concurrent, wall total", total, "")
    table.add_row("upload of a 10 MB tree (100 files)", f"{results['upload_10mb_p50_ms']:.1f}", "")
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0
