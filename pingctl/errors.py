"""User-facing errors: the CLI prints these as one clear message, never a traceback.

Exit codes (README, "Exit codes"): 1 bad input data or environment, 2 a usage or config error
(as Typer's own option errors), 70 an internal error, 130 interrupted.
"""


class PingctlError(Exception):
    """Bad input, bad config or an environment problem the user can fix."""

    exit_code = 1
    kind = "input"


class UsageError(PingctlError):
    """An option value or a combination of options the command cannot take: the command line
    itself must change, so scripts can tell it from a data problem by the exit code."""

    exit_code = 2
    kind = "usage"


class ConfigError(UsageError):
    kind = "config"


def duckdb_interrupted(e: BaseException) -> bool:
    """Ctrl-C inside a DuckDB query surfaces as DuckDB's own error, not KeyboardInterrupt: a
    RuntimeError('Query interrupted') when the binding sees the signal, else InterruptException."""
    return (type(e) is RuntimeError and str(e) == "Query interrupted") or type(e).__name__ == "InterruptException"


def duckdb_out_of_memory(e: BaseException) -> bool:
    return type(e).__name__ == "OutOfMemoryException"
