"""Model presets: the architecture part of the rendered MaxText config."""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # CPU smoke test: trains in seconds.
    "tiny": dict(emb_dim=64, layers=2, heads=4, head_dim=16, mlp_dim=256, mlp_activations=["gelu"], dtype="float32"),
    # ~3.3M parameters: trains on a laptop CPU in half an hour; small enough not to memorise its training
    # pairs before it learns where addresses are on a mesh of few distinct pairs (docs/train.md,
    # "Presets": which preset for which world).
    "mini": dict(emb_dim=256, layers=4, heads=4, head_dim=64, mlp_dim=1024, mlp_activations=["gelu"], dtype="float32"),
    # ~20M parameters: memorises the training pairs of a small mesh; with weight decay 1.0 on a mesh
    # of many distinct pairs it is the held-out-pairs preset (docs/eval.md, "Held-out pairs: the recipe").
    "small": dict(emb_dim=512, layers=6, heads=8, head_dim=64, mlp_dim=2048, mlp_activations=["gelu"], dtype="float32"),
    # The seeds' model: ~85M parameters (20 x (4*640^2 + 2*640*2048) + embeddings).
    "base": dict(emb_dim=640, layers=20, heads=10, head_dim=64, mlp_dim=2048, mlp_activations=["gelu"], dtype="bfloat16"),
}


# MaxText keys in `model.overrides` that change the architecture, by preset field.
ARCH_KEYS = {
    "base_emb_dim": "emb_dim",
    "base_num_decoder_layers": "layers",
    "base_num_query_heads": "heads",
    "base_num_kv_heads": "kv_heads",
    "head_dim": "head_dim",
    "base_mlp_dim": "mlp_dim",
    "mlp_activations": "mlp_activations",
}


def architecture(preset: str, overrides: dict | None = None) -> dict:
    """The preset with `model.overrides` applied, so that a resized model reports its own size."""
    overrides = overrides or {}
    return {**PRESETS[preset], **{field: overrides[key] for key, field in ARCH_KEYS.items() if key in overrides}}


def param_count(preset: dict, vocab_size: int) -> int:
    """Weights of the rendered architecture (attention, MLP, norms, untied embeddings)."""
    d, layers, f = preset["emb_dim"], preset["layers"], preset["mlp_dim"]
    q, kv = preset["heads"], preset.get("kv_heads", preset["heads"])
    attn = d * preset["head_dim"] * (2 * q + 2 * kv)  # query and output projections, key and value
    mlp = d * f * (len(preset["mlp_activations"]) + 1)
    norms = 2 * d
    return layers * (attn + mlp + norms) + 2 * vocab_size * d + d
