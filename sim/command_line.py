"""Both command lines, `python -m sim` and `python -m profiler`, in one form: a `CommandLine` whose
commands are functions registered with `@cli.command(name, add_arguments)`, each running on the
parsed arguments (importing what it needs, so that `--help` and `sim run` start fast), its
docstring the command's help. Usage mistakes and bad input are one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from sim.errors import exit_code


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage mistakes are bad input too: one line, exit code 2."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, unless the help says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]      # None counts as success


class CommandLine:
    """One program's commands, in the order they are registered."""

    def __init__(self, prog: str, description: str):
        self.prog = prog
        self.description = description
        self.commands: list[Command] = []

    def command(self, name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
        """Register the decorated function as command `name`; its docstring is the help."""
        def register(run: Callable[[argparse.Namespace], int | None]):
            self.commands.append(Command(name, " ".join((run.__doc__ or "").split()), add_arguments, run))
            return run
        return register

    def build_parser(self) -> OneLineParser:
        parser = OneLineParser(prog=self.prog, description=self.description,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        subparsers = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
        for command in self.commands:
            command.add_arguments(subparsers.add_parser(command.name, help=command.help,
                                                        formatter_class=DefaultsFormatter))
        return parser

    def main(self, argv: list[str] | None = None) -> int:
        """Parse argv and run its command: the command's exit code (0 when it returns none)."""
        args = self.build_parser().parse_args(argv)
        command = next(c for c in self.commands if c.name == args.command)
        return exit_code(lambda: command.run(args) or 0)


def arguments_of(args: argparse.Namespace, *leave_out: str) -> dict:
    """The parsed arguments as a mapping for a typed config, the command's name (and leave_out) left out."""
    return {k: v for k, v in vars(args).items() if k != "command" and k not in leave_out}
