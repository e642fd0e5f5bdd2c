"""The network both decoders of pingctl's own (the JAX engine, pingctl/infer/engines/jax/, and
the NumPy one, pingctl/infer/engines/numpy/) compute: MaxText's `llama2` decoder block as
`pingctl train` configures it, read from a model's MaxText keys, and its weights by name.

`Arch.from_keys` reads the MaxText keys of a run's maxtext.yml or an export's config.json and
refuses (`Unsupported`) any key that would change the network in a way these decoders do not
implement, so a model they cannot reproduce is never answered wrongly: the loader falls back to
the engine the table names (`Engine.fallback`: MaxText).

Weights come by name (`pingctl.artifacts.export`: the nnx state path joined by dots), with the
scanned layers stacked on axis 1 as MaxText keeps them; `layout` gives a decoder its
parameters from them, layer axis first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.artifacts.run import MAXTEXT_YML, RUN_ONLY_KEYS, read_maxtext_doc
from pingctl.errors import PingctlError
from pingctl.infer.engines.base import Unsupported

# MaxText keys (base.yml defaults) this engine implements, by meaning.
_DEFAULTS = {
    "dtype": "bfloat16",
    "normalization_layer_epsilon": 1e-5,
    "rope_min_timescale": 1,
    "rope_max_timescale": 10_000,
    "float32_qk_product": False,
    "float32_logits": False,
    "activations_in_float32": False,
    "logits_dot_in_fp32": False,
}
# Keys whose value must be MaxText's default (or one listed) for this engine to be the same network.
_FIXED = {
    "decoder_block": ("llama2",),
    "logits_via_embedding": (False,),
    "scan_layers": (True,),
    "param_scan_axis": (1,),
    "fused_qkv": (False,),
    "fused_mlp": (False,),
    "use_qk_norm": (False,),
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "rope_type": ("default",),
    "rope_linear_scaling_factor": (1, 1.0),
    "use_untrainable_positional_embedding": (False,),
    "trainable_position_size": (-1, 0),
    "final_logits_soft_cap": (None, 0, 0.0),
    "attn_logits_soft_cap": (None, 0, 0.0),
    "global_parameter_scale": (1,),
    "num_experts": (1,),
    "quantization": ("", None),
    "attention_type": ("global",),
    "cast_logits_to_fp32": (True, False),  # the log-softmax is taken in float32 either way
    "use_iota_embed": (False, True),  # a one-hot matmul picks the same rows
    "matmul_precision": ("default", "high", "highest", "float32", "bfloat16"),  # float32 on a CPU regardless
}
# Keys about training, the run or the runtime (the run-only keys an export leaves out, and more
# that MaxText reads only to train or to shard): no effect on a forward pass.
_IGNORED = RUN_ONLY_KEYS | frozenset({"enable_dropout", "dropout_rate", "max_target_length", "weight_dtype",
    "gradient_clipping_threshold", "opt_type", "max_prefill_predict_length", "load_parameters_path", "shard_mode",
    "gradient_accumulation_steps", "packing", "enable_data_shuffling", "data_shuffle_seed", "init_weights_seed",
    "checkpoint_storage_use_ocdbt", "checkpoint_storage_use_zarr3", "profiler"})
_IGNORED_PREFIXES = ("adam_", "wandb_", "tensorboard_", "ici_", "dcn_", "profiler_", "upload_", "checkpoint_")
ACTIVATIONS = ("gelu", "relu", "silu", "linear")  # jax.nn's (gelu: the tanh approximation, its default)
_SHAPE_KEYS = ("vocab_size", "base_emb_dim", "base_num_decoder_layers", "base_num_query_heads", "head_dim",
               "base_mlp_dim")


@dataclass(frozen=True)
class Arch:
    vocab: int
    emb: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    activations: tuple[str, ...]
    dtype: str
    eps: float = 1e-5
    rope_min: float = 1
    rope_max: float = 10_000
    float32_qk_product: bool = False
    float32_logits: bool = False
    activations_in_float32: bool = False
    logits_dot_in_fp32: bool = False
    weight_dtype: str = "float32"  # what the weights are stored as (cast to `dtype` for compute)

    @classmethod
    def from_keys(cls, keys: dict) -> Arch:
        """The architecture MaxText builds from these keys (a maxtext.yml, or an export's
        architecture.maxtext), or `Unsupported` naming the first key this engine cannot honour."""
        missing = [k for k in _SHAPE_KEYS if k not in keys]
        if missing:
            raise Unsupported(f"no {missing[0]} among the model's MaxText keys")
        for k, v in keys.items():
            if k in _FIXED:
                if v not in _FIXED[k]:
                    raise Unsupported(f"MaxText key {k}={v!r} (the light engine implements {k}={_FIXED[k][0]!r})")
            elif k not in _DEFAULTS and k not in _SHAPE_KEYS and k not in ("base_num_kv_heads", "mlp_activations") \
                    and k not in _IGNORED and not k.startswith(_IGNORED_PREFIXES):
                raise Unsupported(f"MaxText key {k}={v!r}, which the light engine does not implement")
        get = {**_DEFAULTS, **keys}.get
        acts = get("mlp_activations") or ["silu", "linear"]
        acts = tuple([acts] if isinstance(acts, str) else acts)
        for a in acts:
            if a not in ACTIVATIONS:
                raise Unsupported(f"mlp_activations {a!r} (the light engine implements {', '.join(ACTIVATIONS)})")
        heads = int(keys["base_num_query_heads"])
        kv = int(get("base_num_kv_heads") or heads)
        if heads % kv:
            raise Unsupported(f"{heads} query heads do not group over {kv} key-value heads")
        dtype = str(get("dtype"))
        if dtype not in ("float32", "bfloat16", "float16"):
            raise Unsupported(f"dtype {dtype!r}")
        return cls(vocab=int(keys["vocab_size"]), emb=int(keys["base_emb_dim"]),
                   layers=int(keys["base_num_decoder_layers"]), heads=heads, kv_heads=kv,
                   head_dim=int(keys["head_dim"]), mlp=int(keys["base_mlp_dim"]), activations=acts, dtype=dtype,
                   eps=float(get("normalization_layer_epsilon")), rope_min=get("rope_min_timescale"),
                   rope_max=get("rope_max_timescale"), float32_qk_product=bool(get("float32_qk_product")),
                   float32_logits=bool(get("float32_logits")),
                   activations_in_float32=bool(get("activations_in_float32")),
                   logits_dot_in_fp32=bool(get("logits_dot_in_fp32")),
                   weight_dtype=str(keys.get("weight_dtype") or "float32"))

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape of every weight, as MaxText names and stacks them."""
        e, n, k, d, f, L = self.emb, self.heads, self.kv_heads, self.head_dim, self.mlp, self.layers
        wi = {"decoder.layers.mlp.wi.kernel": (e, L, f)} if len(self.activations) == 1 else \
            {f"decoder.layers.mlp.wi_{i}.kernel": (e, L, f) for i in range(len(self.activations))}
        return {
            "token_embedder.embedding": (self.vocab, e),
            "decoder.decoder_norm.scale": (e,),
            "decoder.logits_dense.kernel": (e, self.vocab),
            "decoder.layers.pre_self_attention_layer_norm.scale": (e, L),
            "decoder.layers.post_self_attention_layer_norm.scale": (e, L),
            "decoder.layers.self_attention.query.kernel": (e, L, n, d),
            "decoder.layers.self_attention.key.kernel": (e, L, k, d),
            "decoder.layers.self_attention.value.kernel": (e, L, k, d),
            "decoder.layers.self_attention.out.kernel": (n, L, d, e),
            **wi,
            "decoder.layers.mlp.wo.kernel": (f, L, e),
        }


def check_weights(arch: Arch, tensors: dict, source) -> None:
    """The same names and shapes the architecture has, or an error naming the first that differs."""
    want = arch.weight_shapes()
    for name, shape in want.items():
        if name not in tensors:
            raise PingctlError(f"{source}: tensor {name} is missing: the model's architecture has {len(want)} "
                               f"weights, this file {len(tensors)} tensors")
        if tuple(tensors[name].shape) != shape:
            raise PingctlError(f"{source}: tensor {name} has shape {list(tensors[name].shape)}, the model's "
                               f"architecture {list(shape)}")
        if np.dtype(tensors[name].dtype).name != arch.weight_dtype:
            raise PingctlError(f"{source}: tensor {name} is {np.dtype(tensors[name].dtype).name}, the model's "
                               f"architecture {arch.weight_dtype} (weight_dtype)")
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise PingctlError(f"{source}: tensor {extra[0]} is not a weight of the model's architecture "
                           f"({len(extra)} such)")


# parameter -> weight name (the layer weights, stacked on axis 1, are those under "layers")
_NAMES = {"embedding": "token_embedder.embedding", "final_norm": "decoder.decoder_norm.scale",
          "logits": "decoder.logits_dense.kernel"}
LOGITS = _NAMES["logits"]  # the one weight a decoder may keep in float32 (`logits_dot_in_fp32`)
_LAYER_NAMES = {"pre_norm": "pre_self_attention_layer_norm.scale", "post_norm": "post_self_attention_layer_norm.scale",
                "q": "self_attention.query.kernel", "k": "self_attention.key.kernel",
                "v": "self_attention.value.kernel", "o": "self_attention.out.kernel", "wo": "mlp.wo.kernel"}


def layout(arch: Arch, put) -> dict:
    """The parameters a decoder reads, `put(name, layered)` of each weight: the top-level
    ones, and under "layers" the stacked ones (`layered`: layer axis 1 to move first), the
    MLP's input kernels as a list (one per activation)."""
    wi = ["decoder.layers.mlp.wi.kernel"] if len(arch.activations) == 1 else \
        [f"decoder.layers.mlp.wi_{i}.kernel" for i in range(len(arch.activations))]
    return {**{k: put(name, False) for k, name in _NAMES.items()},
            "layers": {**{k: put(f"decoder.layers.{name}", True) for k, name in _LAYER_NAMES.items()},
                       "wi": [put(n, True) for n in wi]}}


def maxtext_keys(run: Path, export: bool) -> dict:
    """The MaxText keys the network is built from: an export's architecture.maxtext, or the
    run's maxtext.yml (run-only keys included: `Arch.from_keys` ignores them)."""
    if export:
        config = EX.read_config(run)
        config = config.model_dump() if hasattr(config, "model_dump") else config  # a typed config.json
        keys = config["architecture"]["maxtext"]
        where = run / EX.CONFIG
    else:
        where = run / MAXTEXT_YML
        keys = read_maxtext_doc(run)
    if not isinstance(keys, dict):
        raise PingctlError(f"{where}: no MaxText keys describing the network")
    return keys
