"""The ``otel-graph`` command.

Usage
-----
``otel-graph demo [--out DIR]``
    Run the sample workload instrumented. With a collector answering on the OTLP
    endpoint, the telemetry goes there; otherwise to OTLP JSON files in ``DIR``
    (default ``./otel-graph-out``), followed by the report and ``report.html``.
``otel-graph report PATH... [--html FILE] [--top N]``
    Read OTLP JSON lines files (ours, or a collector's ``file`` exporter output) and
    print the bottleneck table, the slowest tasks, worker balance and critical paths.
``otel-graph export --chrome PATH... -o trace.json``
    Write Chrome Trace Event JSON for Perfetto (ui.perfetto.dev) or ``chrome://tracing``.
``otel-graph run script.py [args...]``
    Run a script with ``instrument_scheduler()`` already called, without editing it.

Bad input (a missing file, a file that is not OTLP JSON) ends with a one-line
``otel-graph: ...`` message on stderr and exit status 2, never a traceback. What a
readable file holds that cannot be used (cut lines, out-of-range values) is left out
and counted on stderr, a line per file and kind (``otel-graph: PATH: ...``).

Output files (``--html``, ``-o``) are created readable by their owner only (0600), and
a symlink at their path is replaced, never followed. They are written whatever
happens to stdout: ``otel-graph report f.jsonl --html r.html | head`` writes the page
and exits quietly (status 0) when ``head`` stops reading. Text that stdout's encoding
cannot carry is printed escaped rather than ending the command.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from otel_graph.config import ConfigurationError
from otel_graph.report.otlp_read import BadTelemetryFile


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-graph", description="OpenTelemetry for Dask task graphs.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the sample workload instrumented")
    demo.add_argument("--out", type=Path, default=Path("otel-graph-out"),
                      help="where telemetry files go when no collector answers (default: %(default)s)")
    demo.add_argument("--no-html", action="store_true", help="skip the HTML report")
    report = commands.add_parser("report", help="analyse OTLP JSON files offline")
    report.add_argument("paths", nargs="+", type=Path)
    report.add_argument("--html", type=Path, help="also write a self-contained HTML report here")
    report.add_argument("--top", type=int, default=10, help="slowest tasks to list (default: %(default)s)")
    report.add_argument("--compare", action="store_true",
                        help="compare two runs of one job (the same dask.graph.fingerprint): the last two in one "
                             "file, or the latest of each of two files")
    report.add_argument("--fingerprint", help="with --compare: the runs of this fingerprint")
    export = commands.add_parser("export", help="convert OTLP JSON files for other tools")
    export.add_argument("--chrome", nargs="+", type=Path, required=True, metavar="PATH",
                        help="OTLP JSON files to convert to Chrome Trace Event JSON")
    export.add_argument("-o", "--output", type=Path, required=True)
    run = commands.add_parser("run", help="run a Python script instrumented")
    run.add_argument("script", type=Path)
    run.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        # The user's script behaves as under `python script.py`: its exceptions, exit
        # codes and messages are its own, so nothing of theirs is caught here.
        return _run_script(args.script, args.args)
    _forgiving(sys.stdout)
    try:
        return _dispatch(args)
    except (BadTelemetryFile, ConfigurationError) as exc:
        print(f"otel-graph: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output path that cannot be written, a disk that is full
        if isinstance(exc, BrokenPipeError):  # stdout closed while the command still had work to do
            _discard_stdout()
            return 1
        print(f"otel-graph: {exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from otel_graph.demo import run

        return run(out_dir=args.out, html=not args.no_html)
    if args.command == "report" and (args.compare or args.fingerprint):
        return _compare(args)
    if args.command == "report":
        from otel_graph.report.text import load, render

        loaded = load(args.paths)
        # The reader of stdout may stop early (`| head`): the page asked for is written anyway.
        _say(lambda: render(loaded, sys.stdout, top=args.top))
        if args.html is not None:
            from otel_graph.report.html import write_html

            if sys.stderr.isatty():  # a large trace's page takes seconds: say what is happening
                print(f"writing {args.html} ...", file=sys.stderr, flush=True)
            write_html(loaded, args.html)
            _say(lambda: print(f"\nHTML report: {args.html}"))
        return 0
    return _export_chrome(args.chrome, args.output)


def _compare(args: argparse.Namespace) -> int:
    from otel_graph.report.compare import NothingToCompare, pick_runs, render
    from otel_graph.report.text import load

    problem = ("--fingerprint goes with --compare" if not args.compare else
               "--compare takes one file or two" if len(args.paths) > 2 else
               "--html does not go with --compare" if args.html is not None else None)
    if problem is not None:
        print(f"otel-graph: {problem}", file=sys.stderr)
        return 2
    files = [load([path]).computes for path in args.paths]
    try:
        before, after = pick_runs(files, fingerprint=args.fingerprint)
    except NothingToCompare as exc:
        print(f"otel-graph: {exc}", file=sys.stderr)
        return 2
    _say(lambda: render(before, after, sys.stdout))
    return 0


def _export_chrome(paths: Sequence[Path], output: Path) -> int:
    from otel_graph.report.analysis import distinct_spans
    from otel_graph.report.chrome import write_chrome_trace
    from otel_graph.report.private_files import private_file
    from otel_graph.report.text import read_files

    spans, points = read_files(paths, point_names=("process.", "hw.gpu."))
    spans, duplicates = distinct_spans(spans)  # a span twice would overlap itself on its track
    try:
        with private_file(output) as out:
            written = write_chrome_trace(spans, points, out)
    except OSError as exc:
        raise BadTelemetryFile(f"{output}: cannot write: {exc.strerror}") from None
    repeated = f" ({duplicates} spans read more than once, written once)" if duplicates else ""
    _say(lambda: print(f"{written} events written to {output}{repeated}; "
                       "open it at https://ui.perfetto.dev or chrome://tracing"))
    return 0


def _forgiving(stream: TextIO) -> None:
    """Telemetry text the terminal's encoding cannot carry (latin-1 and a CJK key, a lone
    surrogate) is printed escaped: printing a report must never end it."""
    reconfigure = getattr(stream, "reconfigure", None)  # absent on a StringIO
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


def _say(write: Callable[[], object]) -> None:
    """Run ``write`` on stdout; a reader that stopped reading (`| head`) ends the output, not the command."""
    try:
        write()
        sys.stdout.flush()  # a pipe's buffer would otherwise fail later, at exit
    except BrokenPipeError:
        _discard_stdout()


def _discard_stdout() -> None:
    """Send what is left to /dev/null, so no later write or the exit's flush raises again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (a test's StringIO)
        pass


def _run_script(script: Path, args: Sequence[str]) -> int:
    if not script.is_file():
        print(f"otel-graph: {script}: no such script", file=sys.stderr)
        return 2
    import otel_graph

    try:
        otel_graph.instrument_scheduler()
    except ConfigurationError as exc:
        print(f"otel-graph: {exc}", file=sys.stderr)
        return 2
    path = script.resolve()
    sys.argv = [str(script), *args]
    sys.path[0] = str(path.parent)  # as `python script.py` has it, not this command's directory
    runpy.run_path(str(path), run_name="__main__")  # SystemExit and exceptions propagate as usual
    return 0


if __name__ == "__main__":
    sys.exit(main())
