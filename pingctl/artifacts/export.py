"""A `pingctl export` model directory (docs/export.md): one trained model, self-contained, that
loads without its run directory.

    config.json        what the model is: the MaxText keys that shape the network, vocabulary,
                       prompt shaping, the pingctl config it was trained with, its source
    model.safetensors  the parameters (no optimizer state), one tensor per nnx weight, as trained
    README.md          the model card
    calibration.json   a `pingctl eval` recalibration map (only when one was exported)
    hints.npz          the run's hints file (only for a run trained with hints)

An export is shared (the Hugging Face Hub, pingctl.artifacts.hub): it holds no absolute path of
the machine that wrote it (`shareable`).

Tensor names are the weight's path in the nnx state joined by dots (`decoder.layers.mlp.wi.kernel`);
with MaxText's scanned layers, a layer weight is one tensor holding every layer (along MaxText's
param_scan_axis, axis 1).

Read from its files only (no JAX), as a run directory is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pingctl.atomic import atomic_dir
from pingctl.config import Config, TokenizerConfig, TrainConfig
from pingctl.errors import PingctlError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
CARD = "README.md"
CALIBRATION = "calibration.json"
HINTS = "hints.npz"  # the run's hints file (artifacts.run.HINTS): what a hinted model's answers carry
# optional: the weights of the combined answer `pingctl eval --regimes` fitted (infer.combine.COMBINATION)
COMBINATION = "combination.json"
# Every file an export may hold: what `files` lists, what a Hub download fetches (hub.py), what a
# push replaces. A file added to the layout goes here, or a copy from the Hub would lack it.
FILES = (CONFIG, WEIGHTS, CARD, CALIBRATION, HINTS, COMBINATION)
FORMAT = "pingctl.model-export"
# Raised when a reader of an older version could misread a newer directory (a key changes
# meaning or a file is added that a load must not ignore); added keys alone keep it.
FORMAT_VERSION = 1
MODEL_TYPE = "pingctl"
# config.json's `architectures`, as Hugging Face configs name the class that runs a model: a
# causal (next-token) decoder over measurement tokens; pingctl runs it, no transformers class does
ARCHITECTURES = ["PingctlForCausalLM"]
# config.json's architecture also under the names Hugging Face configs give it (top-level keys,
# what `PretrainedConfig` and model hubs read): Hugging Face name -> architecture.maxtext key.
# hidden_act is derived apart (MaxText lists activations, Hugging Face names one).
# A key the run left to MaxText's base.yml is written with that default (MAXTEXT_DEFAULTS).
HF_KEYS = {
    "hidden_size": "base_emb_dim",
    "num_hidden_layers": "base_num_decoder_layers",
    "num_attention_heads": "base_num_query_heads",
    "num_key_value_heads": "base_num_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "base_mlp_dim",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_target_length",
    "rms_norm_eps": "normalization_layer_epsilon",
    "rope_theta": "rope_max_timescale",
    "torch_dtype": "weight_dtype",
    "tie_word_embeddings": "logits_via_embedding",
}

# MaxText's base.yml values (maxtext 0.2.5) of the keys a Hugging Face key copies, for a run whose
# maxtext.yml leaves them out: the network has these, so its Hugging Face copies must say them.
# Kept here, not read from MaxText, because an export is checked where MaxText is not installed;
# tests/test_export.py compares them with the installed base.yml.
MAXTEXT_DEFAULTS = {"normalization_layer_epsilon": 1e-5, "rope_max_timescale": 10_000, "logits_via_embedding": False,
                    "weight_dtype": "float32", "mlp_activations": ["silu", "linear"]}

Positive = Annotated[int, Field(gt=0)]
Count = Annotated[int, Field(ge=0)]


class _Section(BaseModel):
    # strict: a "5" is no step and "abc" no list of steps (a list of its characters, once); extra
    # keys are allowed, as a newer pingctl may add keys without a new FORMAT_VERSION
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class _Source(_Section):
    run: str
    steps: list[Count] = Field(min_length=1)
    step: Count

    @model_validator(mode="after")
    def _step_is_one_of_steps(self):
        if self.step not in self.steps:
            raise ValueError(f"step {self.step} is not one of steps {self.steps}")
        return self


class _Maxtext(_Section):
    """The MaxText keys that shape the network (the rest come from MaxText's base.yml)."""
    base_emb_dim: Positive
    base_num_decoder_layers: Positive
    base_num_query_heads: Positive
    base_num_kv_heads: Positive | None = None
    head_dim: Positive
    base_mlp_dim: Positive
    vocab_size: Positive
    max_target_length: Positive
    mlp_activations: list[str] | None = Field(None, min_length=1)
    decoder_block: str | None = None
    dtype: str | None = None
    weight_dtype: str | None = None


class _Architecture(_Section):
    preset: str
    overrides: dict[str, Any]
    parameters: Positive
    layers: Positive
    emb_dim: Positive
    heads: Positive
    head_dim: Positive
    mlp_dim: Positive
    mlp_activations: list[str] = Field(min_length=1)
    dtype: str
    maxtext: _Maxtext


class _Vocab(_Section):
    size: Positive
    scheme: TokenizerConfig.model_fields["scheme"].annotation


class _Tokenizer(_Section):
    scheme: TokenizerConfig.model_fields["scheme"].annotation


class _Loader(_Section):
    seq_len: Positive
    max_per_pair: Count
    result_last: float = Field(ge=0, le=1)
    mode_weights: list[Annotated[float, Field(ge=0)]] = Field(min_length=3, max_length=3)
    timestamps: bool
    # hinted answers are read relative to the hint (loader.relative_target); absent before it existed
    relative_target: bool = False


class _Weights(_Section):
    file: Literal[WEIGHTS]
    tensors: Positive
    elements: Positive
    dtypes: list[str] = Field(min_length=1)


class ExportConfig(_Section):
    """config.json as a typed model: every field a reader uses, its type and range."""
    format: Literal[FORMAT]
    format_version: Annotated[int, Field(ge=1, le=FORMAT_VERSION)]
    pingctl_version: str
    created: str | None = None
    source: _Source
    architecture: _Architecture
    vocab: _Vocab
    tokenizer: _Tokenizer
    loader: _Loader
    weights: _Weights
    calibration: Literal[CALIBRATION] | None = None
    eval_report: str | None = None
    pingctl_config: dict[str, Any]
    model_type: Literal[MODEL_TYPE] | None = None  # absent in exports of pingctl before the Hugging Face keys

    @model_validator(mode="after")
    def _consistent(self):
        net = self.architecture.maxtext
        if self.vocab.size != net.vocab_size:
            raise ValueError(f"vocab.size {self.vocab.size} differs from architecture.maxtext.vocab_size "
                             f"{net.vocab_size}")
        if self.vocab.scheme != self.tokenizer.scheme:
            raise ValueError(f"vocab.scheme {self.vocab.scheme!r} differs from tokenizer.scheme "
                             f"{self.tokenizer.scheme!r}")
        if self.loader.seq_len > net.max_target_length:
            raise ValueError(f"loader.seq_len {self.loader.seq_len} exceeds architecture.maxtext.max_target_length "
                             f"{net.max_target_length}")
        section = self.pingctl_config.get("loader")
        embedded = section.get("relative_target", False) if isinstance(section, dict) else False
        if embedded != self.loader.relative_target:  # one edited alone would read answers in the wrong unit
            raise ValueError(f"loader.relative_target {self.loader.relative_target} differs from "
                             f"pingctl_config.loader.relative_target {embedded}")
        # the Hugging Face names are copies: one edited alone would describe another network
        extra = self.model_extra or {}
        stated = net.model_dump(exclude_none=True)
        want = hf_fields({**MAXTEXT_DEFAULTS, **stated})
        for hf in sorted(set(extra) & set(want) - {"model_type", "architectures"}):  # those two are names, not copies
            if extra[hf] != want[hf]:
                raise ValueError(f"{hf} {extra[hf]!r} differs from {_hf_source(hf, stated)} {want[hf]!r}")
        return self


def _hf_source(hf: str, stated: dict) -> str:
    """Where a Hugging Face key's value comes from, for a refusal: the maxtext key, or MaxText's
    default where the export does not state it."""
    key = HF_KEYS.get(hf, "mlp_activations")
    source = f"architecture.maxtext.{key}"
    return source if key in stated else f"{source} (not stated: MaxText's default)"


def is_export_dir(path: Path | str) -> bool:
    """The one rule for "this is an export": a directory holding its config and its weights
    (what they hold is checked when read, so a damaged one is named, not mistaken)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG).is_file() and (path / WEIGHTS).is_file()


def weights_path(export: Path | str) -> Path:
    return Path(export) / WEIGHTS


def read_config(export: Path | str) -> dict:
    """config.json, checked for every reader: the format, its version, then every field's type
    and range (ExportConfig); a damaged one is an error naming the field. Returns it as read."""
    f = Path(export) / CONFIG
    try:
        config = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise PingctlError(f"{f}: not readable as JSON ({e})") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise PingctlError(f"{f}: not a `pingctl export` model (field format is {found!r}, expected {FORMAT!r})")
    version = config.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise PingctlError(f"{f}: format_version {version!r}, written by a newer pingctl "
                           f"({config.get('pingctl_version')}); this one reads up to {FORMAT_VERSION}: upgrade pingctl")
    try:
        ExportConfig.model_validate(config)
    except ValidationError as e:
        raise PingctlError(f"{f}: a damaged export ({_first_error(e)}); export the run again") from None
    return config


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    field = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"field {field} is missing"
    if not field:  # a rule over several fields: its message names them
        return msg
    shown = json.dumps(err.get("input"), default=str)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"field {field} = {shown}: {msg}"


def hf_fields(maxtext: dict) -> dict:
    """The Hugging Face names of the network keys in `maxtext` (those given: a default the caller
    knows must be in it), with model_type and architectures; merged into config.json's top level."""
    out = {"model_type": MODEL_TYPE, "architectures": list(ARCHITECTURES)}
    out.update({hf: maxtext[key] for hf, key in HF_KEYS.items() if maxtext.get(key) is not None})
    acts = maxtext.get("mlp_activations") or []
    acts = [a for a in ([acts] if isinstance(acts, str) else acts) if a != "linear"]
    if acts:  # ["silu", "linear"] is a gated SiLU MLP: Hugging Face calls it hidden_act "silu"
        out["hidden_act"] = acts[0]
    return out


def pingctl_config(export: Path | str) -> Config:
    """The resolved config the exported model was trained with (what `run_config` is for a run)."""
    raw = read_config(export)["pingctl_config"]
    try:
        return Config.model_validate(raw)
    except ValueError as e:  # pydantic's ValidationError
        first = str(e).strip().splitlines()[0][:200]
        raise PingctlError(f"{Path(export) / CONFIG}: field pingctl_config is not a pingctl config ({first})") from None


def source_steps(config: dict) -> list[int]:
    return [int(s) for s in config["source"]["steps"]]


def source_run(path: Path | str) -> Path:
    """The run a model directory's weights come from: an export's source run (as it names it:
    the last two parts of the run's path), a run itself."""
    path = Path(path)
    if is_export_dir(path):
        return Path(read_config(path)["source"]["run"])
    return path


def fitted_for(fitted_run: str, model_dir: Path | str) -> bool:
    """Whether a calibration map fitted on the model directory `fitted_run` fits the weights of
    `model_dir`: the same directory, or, for an export, its source run. An export names its run
    by the last two parts of its path (it holds no absolute path, and the map shared with it was
    fitted on another machine), so that is what is compared."""
    model_dir = Path(model_dir)
    if fitted_run and Path(fitted_run).resolve() == model_dir.resolve():
        return True
    if is_export_dir(model_dir):
        return bool(fitted_run) and shown_path(fitted_run) == shown_path(read_config(model_dir)["source"]["run"])
    return False


def shown_path(p) -> str:
    """A path as an export shows it: its last two parts (`rows/train`), never the exporting
    machine's absolute path."""
    return "/".join(Path(str(p)).parts[-2:]).lstrip("/") if p else "-"


# An absolute path inside a string: a "/" (not "//", a URL's) at the start or after a space, a
# quote, "=", ":", "(" or ",", up to the next of those
_ABSOLUTE = re.compile(r"(?<![^\s'\"=:(,])/(?!/)[^\s'\";:,()]+")


def shareable(value):
    """`value` (JSON-like: dicts, lists, strings...) with every absolute path in its strings cut
    to its last two parts, so an export published on the Hub discloses no directory of the
    machine that wrote it (its user's home, its temporary directories)."""
    if isinstance(value, dict):
        return {k: shareable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shareable(v) for v in value]
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: shown_path(m.group(0)), value)
    return value


def shareable_config(doc: dict) -> dict:
    """A run's config.yaml as an export carries it (`pingctl_config`): shareable, its hints file
    named as the export holds it, and its compilation cache the default where the run named a
    directory of its own machine (one cut to two parts would be relative to wherever it loads)."""
    out = shareable(doc)
    loader, train = out.get("loader"), out.get("train")
    if isinstance(loader, dict) and loader.get("hints_file"):
        loader["hints_file"] = HINTS
    if isinstance(train, dict) and str(train.get("jax_cache_dir", "")).startswith("/"):
        train["jax_cache_dir"] = TrainConfig.model_fields["jax_cache_dir"].default
    return out


def maxtext_yaml(config: dict, output_dir: Path) -> str:
    """The maxtext.yml MaxText builds this model from: its base config, the export's
    network keys, and a scratch `output_dir` (an export has no run directory to write into)."""
    doc = {"base_config": "base.yml", "run_name": "export", "base_output_directory": str(output_dir),
           **config["architecture"]["maxtext"]}
    return ("# MaxText config rendered by pingctl from an export's config.json (architecture.maxtext)\n"
            + yaml.safe_dump(doc, sort_keys=False))


def write(out: Path, config: dict, tensors: dict, card: str, calibration: dict | None = None,
          hints: Path | None = None, combination: dict | None = None) -> Path:
    """The whole directory, atomically: a reader never finds config.json without its weights.
    `tensors`: name -> NumPy array, written in name order (a deterministic file). `hints`: the
    run's hints file, copied; `combination`: the combined answer's weights, as JSON."""
    from safetensors.numpy import save_file

    out = Path(out)
    with atomic_dir(out) as tmp:
        save_file({k: tensors[k] for k in sorted(tensors)}, str(tmp / WEIGHTS),
                  metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)})
        _sort_metadata(tmp / WEIGHTS)
        # safetensors creates its file 0600; the export is shared as the other files are (umask)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp / WEIGHTS, 0o666 & ~mask)
        if calibration is not None:
            (tmp / CALIBRATION).write_text(json.dumps(calibration, indent=2, sort_keys=True) + "\n")
        if hints is not None:
            shutil.copyfile(hints, tmp / HINTS)
        if combination is not None:
            (tmp / COMBINATION).write_text(json.dumps(combination, indent=2, sort_keys=True) + "\n")
        (tmp / CARD).write_text(card)
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def _sort_metadata(f: Path) -> None:
    """safetensors writes its metadata in a hash map's order, which changes from one process to
    the next: rewrite the header with the metadata's keys sorted, so one export always has the
    same bytes. The header keeps its length (same keys and values), so no offset moves."""
    with open(f, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        meta = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
        text = json.dumps(ordered, separators=(",", ":")).encode()
        if len(text) > n:  # not the JSON safetensors wrote; keep its own header
            return
        fh.seek(8)
        fh.write(text + b" " * (n - len(text)))


def read_tensors(export: Path | str) -> dict:
    """name -> NumPy array; a damaged file, or a tensor holding NaN or infinity (a model that
    would answer NaN probabilities as if they were answers), is an error naming it."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    f = weights_path(export)
    try:
        tensors = load_file(str(f))
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise PingctlError(f"{f}: not a readable safetensors file ({str(e).strip()[:200]}); "
                           "export the run again") from None
    check_finite(tensors, f, "export the run again from a checkpoint whose weights are finite")
    return tensors


def check_finite(tensors: dict, source: Path | str, fix: str) -> None:
    """Refuse weights holding NaN or infinity (a diverged run, a damaged copy): a model with
    them answers NaN probabilities as if they were answers. `tensors`: name -> array (NumPy,
    bfloat16 included, or anything np.asarray takes); the error names `source`, the tensor, and
    `fix`, what to do."""
    import numpy as np

    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if a.dtype.kind in "biu":  # integers and booleans are always finite
            continue
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))  # bfloat16 (ml_dtypes) included
        if bad:
            raise PingctlError(f"{source}: tensor {name} holds {bad:,} non-finite values (NaN or infinity) of "
                               f"{a.size:,}; a model with them answers nothing meaningful: {fix}")


def files(export: Path | str) -> list[dict]:
    """[{name, bytes}] of the files an export holds (of FILES)."""
    export = Path(export)
    return [{"name": n, "bytes": (export / n).stat().st_size} for n in FILES if (export / n).is_file()]
