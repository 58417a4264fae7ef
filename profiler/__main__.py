"""python -m profiler live ...: see profiler/live.py and docs/live.md."""
import argparse
import sys

from sim.cli import OneLineParser
from sim.errors import ScenarioError


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m profiler", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    from profiler.live import add_live_arguments, live_command

    live = commands.add_parser("live", help="real speculative decoding on a real model, every step recorded",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_live_arguments(live)
    args = parser.parse_args(argv)
    try:
        return live_command(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


raise SystemExit(main())
