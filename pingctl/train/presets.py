"""Model presets: the architecture part of the rendered MaxText config."""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # CPU smoke test: trains in seconds.
    "tiny": dict(emb_dim=64, layers=2, heads=4, head_dim=16, mlp_dim=256, mlp_activations=["gelu"], dtype="float32"),
    # ~20M parameters: a real model that still trains on a laptop CPU.
    "small": dict(emb_dim=512, layers=6, heads=8, head_dim=64, mlp_dim=2048, mlp_activations=["gelu"], dtype="float32"),
    # The seeds' model: ~85M parameters (20 x (4*640^2 + 2*640*2048) + embeddings).
    "base": dict(emb_dim=640, layers=20, heads=10, head_dim=64, mlp_dim=2048, mlp_activations=["gelu"], dtype="bfloat16"),
}


def param_count(preset: dict, vocab_size: int) -> int:
    """Weights of the rendered architecture (attention, MLP, norms, untied embeddings)."""
    d, layers, f = preset["emb_dim"], preset["layers"], preset["mlp_dim"]
    attn = d * preset["heads"] * preset["head_dim"] * 4
    mlp = d * f * (len(preset["mlp_activations"]) + 1)
    norms = 2 * d
    return layers * (attn + mlp + norms) + 2 * vocab_size * d + d
