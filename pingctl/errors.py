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


class Interrupted(PingctlError):
    """Ctrl-C where the command has more to say than that it stopped (what it kept, how to go on)."""

    exit_code = 130
    kind = "interrupted"


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
            **dict.fromkeys(("jax", "jaxlib", "scoringrules", "scipy"), "infer"),
            # eval's and train's plots have it through [infer] and [train]; alone it is [plot]
            "matplotlib": "plot",
            # a model named by its Hugging Face Hub repo id, and `export --push-to-hub`
            "huggingface_hub": "hub",
            **dict.fromkeys(("maxtext", "flax", "optax", "orbax", "tokamax", "modal"), "train")}
# The name a user installs where it differs from the import name: `ripe` is a namespace
# that ripe-atlas-cousteau (and ripe.atlas.sagan) install into
PACKAGE_OF = {"ripe": "ripe-atlas-cousteau", "array_record": "array-record", "indexed_bzip2": "indexed-bzip2",
              "orbax": "orbax-checkpoint"}
# What each command needing more than the base install imports, checked (without importing
# anything) before it writes anything: {command: (extra, modules)}. `pingctl --help` lists it.
COMMAND_NEEDS = {
    "fetch": ("data", ("ripe.atlas.cousteau", "orjson")),
    "ingest": ("data", ("orjson", "msgspec", "indexed_bzip2", "zstandard")),
    "build-rows": ("data", ("array_record",)),
    "train": ("train", ("maxtext", "jax", "flax", "optax", "orbax.checkpoint", "tokamax", "grain", "array_record")),
    # the run trains in Modal's image, which installs [train] itself: here only Modal's client
    "train --target modal": ("train", ("modal",)),
    "pull": ("train", ("modal",)),
    "eval": ("infer", ("scoringrules", "scipy", "matplotlib")),
    "sample --plot": ("plot", ("matplotlib",)),
    "export --push-to-hub": ("hub", ("huggingface_hub",)),
}


def _package(module: str) -> str:
    top = module.split(".")[0]
    return PACKAGE_OF.get(top, top).replace("_", "-")


def package_names(modules) -> list[str]:
    """The names to pip install for import names, each once."""
    return list(dict.fromkeys(map(_package, modules)))


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is absent
        return False


def install_line(extra: str) -> str:
    """The pip command that adds `extra` to this install, as it was installed: pingctl is not
    on PyPI, so `pip install 'pingctl[x]'` is only true for an index that holds it; a wheel, a
    clone or a repository URL pip recorded (PEP 610, direct_url.json) is named as such."""
    import json
    import shlex
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        direct = json.loads(metadata.distribution("pingctl").read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, ValueError):
        direct = None
    if not isinstance(direct, dict) or not direct.get("url"):
        return f"pip install {shlex.quote(f'pingctl[{extra}]')}"
    url = direct["url"]
    if isinstance(direct.get("dir_info"), dict):
        editable = "-e " if direct["dir_info"].get("editable") else ""
        path = unquote(urlparse(url).path) if url.startswith("file:") else url
        return f"pip install {editable}{shlex.quote(f'{path}[{extra}]')}"
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict):
        rev = vcs.get("requested_revision")
        url = f"{vcs.get('vcs', 'git')}+{url}" + (f"@{rev}" if rev else "")
    return f"pip install {shlex.quote(f'pingctl[{extra}] @ {url}')}"


def require_extra(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """`what` (a command, an option) needs `modules` of `extra`: where any is not installed, one
    line naming them and the pip command, raised before the caller creates anything (an
    ImportError later would be a traceback, or a worker's crash beside a half-made output)."""
    missing = package_names(m for m in modules if not _importable(m))
    if missing:
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise PingctlError(f"{what} needs the [{extra}] extra, which this install lacks ({names}): "
                           f"{install_line(extra)}")


def require_command(command: str) -> None:
    """`require_extra` for a command of COMMAND_NEEDS ("fetch", "sample --plot")."""
    extra, modules = COMMAND_NEEDS[command]
    require_extra(f"pingctl {command}", extra, modules)


def missing_extra(e: BaseException) -> str | None:
    """One line naming the package and the extra to install, for an optional package this
    install lacks that no check before the work caught."""
    if not isinstance(e, ModuleNotFoundError) or not e.name:
        return None
    module = e.name.split(".")[0]
    extra = EXTRA_OF.get(module)
    if extra is None:
        return None
    return f"this command needs {_package(e.name)}, from the [{extra}] extra, which this install lacks: {install_line(extra)}"
