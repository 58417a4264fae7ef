"""python -m profiler live | study | hf-live | calibrate | inspect: see docs/live.md and docs/architecture.md."""
import argparse
import sys

from sim.cli import OneLineParser
from sim.errors import ScenarioError


def main(argv=None) -> int:
    parser = OneLineParser(prog="python -m profiler", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    from profiler.calibrate import add_calibrate_arguments, calibrate_command
    from profiler.inspect_bundle import add_inspect_arguments, inspect_command
    from profiler.live import add_live_arguments, live_command
    from profiler.hf_engine import add_hf_live_arguments, hf_live_command
    from profiler.study import add_study_arguments, study_command

    for name, text, add_arguments, run in (
            ("live", "real speculative decoding on a real model, every step recorded", add_live_arguments,
             live_command),
            ("study", "the live runs of a validation study, the model loaded once", add_study_arguments,
             study_command),
            ("hf-live", "Hugging Face transformers' own generate (prompt lookup), recorded as a live run",
             add_hf_live_arguments, hf_live_command),
            ("calibrate", "time the engine's operators on this device; write a bundle", add_calibrate_arguments,
             calibrate_command),
            ("inspect", "achieved bandwidth and FLOP rate of a bundle's operators", add_inspect_arguments,
             inspect_command)):
        command = commands.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_arguments(command)
        command.set_defaults(run=run)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


raise SystemExit(main())
