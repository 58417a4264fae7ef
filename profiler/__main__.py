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

    live = commands.add_parser("live", help="real speculative decoding on a real model, every step recorded",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_live_arguments(live)
    live.set_defaults(run=live_command)
    study = commands.add_parser("study", help="the live runs of a validation study, the model loaded once")
    add_study_arguments(study)
    study.set_defaults(run=study_command)
    hf_live = commands.add_parser("hf-live", help="Hugging Face transformers' own generate (prompt lookup), "
                                                  "recorded as a live run")
    add_hf_live_arguments(hf_live)
    hf_live.set_defaults(run=hf_live_command)
    calibrate = commands.add_parser("calibrate", help="time the engine's operators on this device; write a bundle",
                                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_calibrate_arguments(calibrate)
    calibrate.set_defaults(run=calibrate_command)
    inspect = commands.add_parser("inspect", help="achieved bandwidth and FLOP rate of a bundle's operators")
    add_inspect_arguments(inspect)
    inspect.set_defaults(run=inspect_command)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


raise SystemExit(main())
