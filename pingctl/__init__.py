"""pingctl: a generative Transformer over internet latency measurements.

`from pingctl import Model` is the Python API (`pingctl.api`, docs/api.md); it is imported on
first use, so `import pingctl` (which every command and layer does, for `__version__`) stays
light.
"""

__version__ = "0.1.0"

_LAZY = {"Model": "pingctl.api", "Rtt": "pingctl.api", "Predictions": "pingctl.api", "Context": "pingctl.api"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        # import_module, not an import statement: every layer imports this package for
        # __version__, and a static import of the top layer here would put an upward import
        # in each of them for the layer contracts (.importlinter)
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pingctl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
