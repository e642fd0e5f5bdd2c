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


# The extra of pyproject.toml that brings each optional package (by import name): the base
# install answers questions, and whatever needs more names the extra to install.
EXTRA_OF = {**dict.fromkeys(("grain", "array_record", "indexed_bzip2", "zstandard", "orjson", "msgspec", "ripe"),
                            "data"),
            **dict.fromkeys(("jax", "jaxlib", "scoringrules", "scipy", "matplotlib"), "infer"),
            **dict.fromkeys(("maxtext", "flax", "optax", "orbax", "tokamax", "modal"), "train")}


def missing_extra(e: BaseException) -> str | None:
    """One line naming the extra to install, for an optional package this install lacks."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    package = e.name.split(".")[0]
    extra = EXTRA_OF.get(package)
    return None if extra is None else f"this command needs {package}, which this install lacks: pip install 'pingctl[{extra}]'"
