"""The ``softmaxkit`` command: ``list``, ``bench``, ``arena``, ``report`` and ``compare``.

Examples::

    softmaxkit list                       # every registered normalizer
    softmaxkit bench kernels --quick      # one benchmark suite, small shapes
    softmaxkit arena dispersion max_retrieval --quick
    softmaxkit report --quick --out softmaxkit-report   # everything, as index.html + results.json
    softmaxkit report --quick --out new --compare old   # ... and what moved since the run in old/
    softmaxkit compare old new            # the same comparison of two finished runs, in the terminal
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ._plugins import FAILED, Outcome

#: Seeds accepted by ``--seed``: ``[0, 2^32)``, numpy's legacy range. The tasks derive seeds from it
#: (``seed * 1_000_003 + n``), which torch's generators take only below 2^64.
SEED_LIMIT = 2**32


def _seed(text: str) -> int:
    """A ``--seed``: an integer in ``[0, 2^32)`` (numpy's generators refuse negative seeds; a seed of
    2e13 overflowed torch's in a task, which failed after the run had started)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {SEED_LIMIT - 1}], got {text!r}") from None
    if not 0 <= seed < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {SEED_LIMIT - 1}], got {seed}")
    return seed


def _parser() -> argparse.ArgumentParser:
    from .arena import TASKS
    from .bench import SUITES

    parser = argparse.ArgumentParser(
        prog="softmaxkit",
        description="softmaxkit: the softmax function and its alternatives. "
                    "List the normalizers, benchmark them, test published claims, write a report.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser("list", help="print every registered normalizer as a table",
                   description="Print every registered normalizer: definition, properties, parameters, paper.")

    suites = "\n".join(f"  {k:<10} {v}" for k, v in SUITES.items())
    bench = sub.add_parser(
        "bench", help="speed and memory against torch and peers (ratios measured in one run)",
        description="Run benchmark suites. Every figure is a ratio to a baseline measured in the same run.",
        epilog=f"suites:\n{suites}\n  all        every suite (default)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("suites", nargs="*", default=["all"], metavar="SUITE",
                       help="suites to run: " + ", ".join(SUITES) + " or all (default: all)")
    bench.add_argument("--quick", action="store_true", help="small shapes and fewer repeats")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cuda: the GPU variant of a suite (attention: fused Triton kernels vs SDPA flash)")

    tasks = "\n".join(f"  {k:<14} {v}" for k, v in TASKS.items())
    arena = sub.add_parser(
        "arena", help="small experiments that test the published claims",
        description="Run arena tasks; each prints the claim it tests and what was measured.",
        epilog=f"tasks:\n{tasks}\n  all            every task (default)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    arena.add_argument("tasks", nargs="*", default=[], metavar="TASK",
                       help="tasks to run: " + ", ".join(TASKS) + " (default: all)")
    arena.add_argument("--quick", action="store_true", help="fewer sizes and training steps")
    arena.add_argument("--seed", type=_seed, default=0, help="random seed (default: 0)")

    report = sub.add_parser(
        "report", help="run bench and arena, write DIR/index.html and DIR/results.json",
        description="Run every benchmark suite and arena task and write a self-contained HTML report "
                    "(tables, claims, verdicts, plots), results.json and tables.md (the tables as Markdown).")
    report.add_argument("--quick", action="store_true", help="the quick versions (a few minutes on 2 cores)")
    report.add_argument("--out", default="softmaxkit-report", metavar="DIR",
                        help="output directory (default: softmaxkit-report)")
    report.add_argument("--seed", type=_seed, default=0, help="random seed for the arena (default: 0)")
    report.add_argument("--bench", nargs="*", default=["all"], metavar="SUITE",
                        help="bench suites to include (default: all; give none to skip the benchmark)")
    report.add_argument("--arena", nargs="*", default=["all"], metavar="TASK",
                        help="arena tasks to include (default: all)")
    report.add_argument("--compare", default=None, metavar="OLD",
                        help="an earlier report directory or its results.json: list every figure that moved "
                             "beyond its run-to-run noise since then, regressions marked")

    compare = sub.add_parser(
        "compare", help="figures that moved between two runs beyond their noise (regressions marked)",
        description="Compare two finished runs (report directories or results.json files): every figure of B "
                    "that moved from A by more than its run-to-run noise (taken from the repeats each run "
                    "measured), every arena figure that changed (fixed seeds) and every verdict that changed.")
    compare.add_argument("old", metavar="A", help="the earlier run: a report directory or results.json")
    compare.add_argument("new", metavar="B", help="the later run: a report directory or results.json")
    return parser


def _print_outcomes(outcomes: list[Outcome]) -> None:
    from .report.text import render_text

    for outcome in outcomes:
        print(f"## {outcome.kind} {outcome.name}: {outcome.status} ({outcome.seconds:.1f} s)")
        if outcome.claim and outcome.status == "ok":
            print(f"Claim: {outcome.claim}")
        for table in outcome.tables:
            print()
            print(render_text(table))
        print()


def _exit_code(outcomes: list[Outcome]) -> int:
    return 1 if any(o.status == FAILED for o in outcomes) else 0


def _cmd_list(args) -> int:
    from .registry import table
    from .report.text import render_text

    print(render_text(table(), width=120))
    from .linear import table as linear_table

    print()
    print(render_text(linear_table(), width=120))
    return 0


def _cmd_bench(args) -> int:
    from . import bench

    names = bench.check_suites(args.suites)
    header = bench.machine_header()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in header.items()))
    outcomes = []
    for name in names:
        print(f"running bench {name} ...", file=sys.stderr, flush=True)
        outcome = bench.run_suite(name, quick=args.quick, device=args.device)
        _print_outcomes([outcome])
        outcomes.append(outcome)
    return _exit_code(outcomes)


def _cmd_arena(args) -> int:
    from . import arena

    names = arena.check_tasks(args.tasks)
    outcomes = []
    for name in names:
        print(f"running arena {name} ...", file=sys.stderr, flush=True)
        outcome = arena.run_task(name, quick=args.quick, seed=args.seed)
        _print_outcomes([outcome])
        outcomes.append(outcome)
    return _exit_code(outcomes)


def _report_preflight(out) -> int | None:
    """Exit status 2, with a one-line error, when the report could not be written (missing
    optional dependencies, an unusable ``--out``), before any benchmark runs."""
    from .report.preflight import preflight

    problem = preflight(out)
    if problem is None:
        return None
    print(f"error: {problem}", file=sys.stderr)
    return 2


def _cmd_report(args) -> int:
    from . import arena, bench
    from .report import load_results, run_report

    suites = args.bench if args.bench else []
    tasks = args.arena if args.arena else None
    if tasks is None:
        print("error: --arena needs at least one task", file=sys.stderr)
        return 2
    # every argument checked before --out is created (a bad one left an empty directory)
    if suites:
        bench.check_suites(suites)
    arena.check_tasks(tasks)
    if args.compare is not None:
        load_results(args.compare)
    failed = _report_preflight(args.out)
    if failed is not None:
        return failed
    start = time.perf_counter()
    index, outcomes = run_report(args.out, quick=args.quick, suites=suites, tasks=tasks, seed=args.seed,
                                 compare_with=args.compare)
    print(f"wrote {index} and {index.parent / 'results.json'} in {time.perf_counter() - start:.0f} s")
    if args.compare is not None:
        from .report.compare import compare_files, render_text

        print(render_text(compare_files(args.compare, index.parent)))
    return _exit_code(outcomes)


def _cmd_compare(args) -> int:
    from .report.compare import compare_files, render_text

    print(render_text(compare_files(args.old, args.new)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``softmaxkit`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    commands = {"list": _cmd_list, "bench": _cmd_bench, "arena": _cmd_arena, "report": _cmd_report,
                "compare": _cmd_compare}
    try:
        return commands[args.command](args)
    except ValueError as err:  # unknown suite or task names, a results.json that cannot be read
        parser.error(str(err))
    except BrokenPipeError:   # the reader went away (softmaxkit list | head): quiet, as cat is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (the exit's flush would raise again)
        return 141
    return 2


if __name__ == "__main__":
    sys.exit(main())
