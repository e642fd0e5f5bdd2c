"""The Python API: a trained model asked from a notebook or a script (docs/api.md).

    from pingctl import Model
    m = Model.load("runs/demo/train")
    m.rtt("78.143.22.26", "194.255.199.229").quantiles

`pingctl serve` and the answering commands (`sample`, `score`) reach the model only through
this package (.importlinter). Its modules, by job: `model` (Model and what it returns),
`arguments` (Python arguments -> checked questions), `checks` (the value parsers and bounds the
service and the CLI check with before any work).
"""

from pingctl.api.model import MAX_DRAWS, MEAN_CEILING_MS, Context, Model, Predictions, Rtt, RttPrompts, _eval_headline

__all__ = ["MAX_DRAWS", "MEAN_CEILING_MS", "Context", "Model", "Predictions", "Rtt", "RttPrompts", "_eval_headline"]
