"""`pingctl bench train`: tokens/s, step time and (on GPU) MFU per preset."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from pingctl.benchutil import run_measured
from pingctl.errors import PingctlError
from pingctl.train.presets import PRESETS

# Dense bf16 peak per device, for MFU (model FLOPs = 6 x parameters x tokens).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def _device_peak() -> tuple[str, float | None]:
    import jax

    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform)
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in kind), None)
    return kind, peak


def bench_train(rows: Path | None, presets: list[str], steps: int, seq_len: int, batch_size: int, hardware: str,
                overrides: Sequence[str] = ()) -> dict:
    """Each preset trained `steps` steps on `rows` (`overrides`: more `--set KEY=VALUE` for
    `pingctl train`, e.g. loader settings), from its summary."""
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        raise PingctlError(f"unknown preset(s) {bad}; choose from {sorted(PRESETS)}")
    table = []
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-train-") as d:
        if rows is None:
            run_measured(["synth", "-o", f"{d}/synth", "--rows", "500000", "--step", "900"])
            run_measured(["build-rows", f"{d}/synth", "-o", f"{d}/rows"])
            rows = Path(d) / "rows"
        for preset in presets:
            s, elapsed, peak_mb = run_measured([
                "train", str(rows), "--run-dir", f"{d}/{preset}", "--preset", preset, "--steps", str(steps),
                "--hardware", hardware, "--set", f"loader.seq_len={seq_len}", "--set", f"loader.batch_size={batch_size}",
                "--set", "train.eval_interval=-1", "--set", f"train.checkpoint_period={steps + 1}",
                *(arg for kv in overrides for arg in ("--set", kv)),
            ])
            tps = s["tokens_per_s_per_device"]
            row = {
                "case": preset,
                "params_m": round(s["parameters"] / 1e6, 2),
                "step_s": round(s["step_seconds"], 4),
                "tokens_per_s": int(tps),
                "model_tflops": round(6 * s["parameters"] * tps / 1e12, 3),
                "input_wait_ms": None if s.get("input_wait_s") is None else round(1e3 * s["input_wait_s"], 2),
                "input_wait_pct": None if s.get("input_wait_share") is None else round(100 * s["input_wait_share"], 1),
                "wall_s": round(elapsed, 1),
            }
            table.append(row)
    kind, peak = _device_peak() if hardware != "cpu" else ("cpu", None)
    for row in table:
        row["mfu_pct"] = round(100 * row["model_tflops"] / peak, 1) if peak else None
    return {
        "name": "train",
        "table": table,
        "device": kind,
        "config": {"steps": steps, "seq_len": seq_len, "batch_size": batch_size, "hardware": hardware,
                   "overrides": list(overrides)},
        "notes": [
            "tokens/s: time-weighted over all steps but the first two (compilation, warm-up); "
            "model TFLOP/s = 6 x parameters x tokens/s; MFU against dense bf16 peak on GPUs",
            "wall_s includes imports, compilation and checkpoint writing",
            "input_wait: how long a step (after the first two) waited for its batch, and its share of the step: "
            "near 100% the input side sets the pace, not the device",
        ],
    }
