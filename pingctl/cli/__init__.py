"""Thin CLI layer: parse options, call the library, print. No computation here.

`main` is the console script: it imports the Typer app itself, so a Ctrl-C during start-up
is an interrupt (exit 130) rather than an import traceback."""


def main() -> None:
    import sys

    try:
        from pingctl.cli.app import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted before the command started; nothing was done\n")
        sys.exit(130)
    run()
