"""Where `pingctl fetch` finds the RIPE Atlas API key, in this order (the first that holds one):

1. the environment variable `--key-env` names, when given (then only that one);
2. $RIPE_ATLAS_KEY;
3. $ATLAS_FETCH_KEY (ripe-atlas-tools' variable for reading results);
4. `authorisation.fetch` in ripe-atlas-tools' configuration file: $XDG_CONFIG_HOME/ripe-atlas-tools/rc,
   or ~/.config/ripe-atlas-tools/rc without $XDG_CONFIG_HOME (as ripe-atlas-tools finds it).

None of them: no key (public measurements need none). The key itself is never printed or
written: messages and the summary name only where it came from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pingctl.errors import PingctlError, UsageError

KEY_ENV = "RIPE_ATLAS_KEY"
TOOLS_ENV = "ATLAS_FETCH_KEY"
RC_FIELD = "authorisation.fetch"
# an rc file is a few hundred bytes; past this it is not one (and is not read into memory)
_RC_MAX_BYTES = 1 << 20
# what an HTTP header can carry as it is: printable ASCII without spaces (a RIPE key is a UUID)
_KEY = re.compile(r"[\x21-\x7e]+")


@dataclass(frozen=True)
class Key:
    value: str | None = field(default=None, repr=False)
    source: str | None = None  # "$RIPE_ATLAS_KEY", "authorisation.fetch in /home/u/.config/...", None


def rc_path() -> Path:
    """ripe-atlas-tools' rc file, where it looks for it (an empty $XDG_CONFIG_HOME counts as
    unset, as the XDG spec says)."""
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(home) / "ripe-atlas-tools" / "rc"


def find_key(key_env: str | None = None) -> Key:
    """The key and where it came from, in the order above. A source that holds something no
    HTTP header can carry as it is, an explicit --key-env that is unset, and an rc file that
    cannot be read are refused, naming the source and never the value."""
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise UsageError(f"--key-env {key_env}: ${key_env} is unset or empty; set it to the API key, or leave "
                             f"--key-env out to read ${KEY_ENV}, ${TOOLS_ENV} or {RC_FIELD} in {rc_path()}")
        return Key(_checked(key, f"${key_env}"), f"${key_env}")
    for env in (KEY_ENV, TOOLS_ENV):
        if os.environ.get(env):
            return Key(_checked(os.environ[env], f"${env}"), f"${env}")
    path = rc_path()
    key = _rc_key(path)
    return Key(_checked(key, f"{RC_FIELD} in {path}"), f"{RC_FIELD} in {path}") if key else Key()


def _checked(key: str, source: str) -> str:
    """Refused, unshown, when an HTTP header cannot carry it as it is: a trailing newline
    (`echo KEY > file`) would be sent as part of it, or printed back by the HTTP library's own
    error."""
    if not _KEY.fullmatch(key):
        raise UsageError(f"{source} holds a character an API key cannot have (white space such as a trailing "
                         "newline, a control character or a non-ASCII one); set it to the key alone "
                         "(its value is not shown)")
    return key


def _rc_key(path: Path) -> str | None:
    """`authorisation.fetch` of the rc file (None: no file, or no key in it). Its messages name
    the line of a YAML error, never the text there: that line may hold the key."""
    import yaml

    try:
        with open(path, "rb") as f:
            data = f.read(_RC_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PingctlError(f"{path}: cannot read it ({e.strerror}); fix it, or give the key in ${KEY_ENV}") from None
    if len(data) > _RC_MAX_BYTES:
        raise PingctlError(f"{path}: larger than {_RC_MAX_BYTES:,} bytes, not a ripe-atlas-tools rc file; "
                           f"give the key in ${KEY_ENV}")
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise PingctlError(f"{path}: not valid YAML{where} (its text is not shown: it may hold the key); fix it, "
                           f"or give the key in ${KEY_ENV}") from None
    except RecursionError:
        raise PingctlError(f"{path}: nested too deep to be a ripe-atlas-tools rc file") from None
    auth = doc.get("authorisation") if isinstance(doc, dict) else None
    key = auth.get("fetch") if isinstance(auth, dict) else None
    if key in (None, ""):
        return None
    if not isinstance(key, str):
        raise PingctlError(f"{path}: {RC_FIELD} is not text (its value is not shown); write the key as "
                           f"`ripe-atlas configure --set {RC_FIELD}=KEY` does, or give it in ${KEY_ENV}")
    return key
