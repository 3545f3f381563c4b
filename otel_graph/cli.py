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
``otel-graph: ...`` message on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

from otel_graph.config import ConfigurationError
from otel_graph.otlp_read import BadTelemetryFile


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
    try:
        return _dispatch(args)
    except (BadTelemetryFile, ConfigurationError) as exc:
        print(f"otel-graph: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # an output path that cannot be written, a disk that is full
        if isinstance(exc, BrokenPipeError):  # `otel-graph report ... | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
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
    if args.command == "report":
        from otel_graph.report import load, render

        loaded = load(args.paths)
        render(loaded, sys.stdout, top=args.top)
        if args.html is not None:
            from otel_graph.html_report import write_html

            write_html(loaded, args.html)
            print(f"\nHTML report: {args.html}")
        return 0
    return _export_chrome(args.chrome, args.output)


def _export_chrome(paths: Sequence[Path], output: Path) -> int:
    from otel_graph.chrome import write_chrome_trace
    from otel_graph.otlp_read import Progress, TelemetryFile

    files = [TelemetryFile.open(path) for path in paths]
    meter = Progress(sum(f.path.stat().st_size for f in files), label="reading")
    spans, points = [], []
    for file in files:
        file._progress = meter
        file_spans, file_points = file.read(point_names=("process.", "hw.gpu."))
        spans.extend(file_spans)
        points.extend(file_points)
    meter.close()
    try:
        with output.open("w", encoding="utf-8") as out:
            written = write_chrome_trace(spans, points, out)
    except OSError as exc:
        raise BadTelemetryFile(f"{output}: cannot write: {exc.strerror}") from None
    print(f"{written} events written to {output}; open it at https://ui.perfetto.dev or chrome://tracing")
    return 0


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
