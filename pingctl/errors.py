"""User-facing errors: the CLI prints these as one clear message, never a traceback."""


class PingctlError(Exception):
    """Bad input, bad config or an environment problem the user can fix."""

    exit_code = 1


class ConfigError(PingctlError):
    exit_code = 2
