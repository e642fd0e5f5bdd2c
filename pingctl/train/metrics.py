"""Metrics from MaxText's log lines -> `metrics.jsonl`, and the loss-curve PNG.

MaxText's own `metrics_file` truncates itself whenever an eval restarts its step counter,
so the run's record is built from the log: every train step line, and one eval entry
(final running loss) per evaluation, keyed by the train step it followed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pingctl.errors import PingctlError

_STEP = re.compile(
    r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.]+), TFLOP/s/device: (?P<tflops>[\d.]+), "
    r"Tokens/s/device: (?P<tps>[\d.]+), total_weights: (?P<weights>[\d.]+), loss: (?P<loss>[\d.naif]+)"
)
_EVAL_START = re.compile(r"Starting eval after train step (?P<step>\d+)")
_EVAL_STEP = re.compile(r"Completed eval step: (?P<k>\d+), .*running loss=(?P<loss>[\d.naif]+)")
_STOPPED = re.compile(r"Training stopped: (?P<why>.*)")  # MaxText left its step loop (and exits 0)
_RESTORE = re.compile(r"[Rr]estor\w* .*?step[ =:]*(?P<step>\d+)")


class LogParser:
    """Feed log lines; collects train and eval records in order."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self._eval_step: int | None = None
        self._eval_loss: float | None = None
        self.first_step: int | None = None
        self.stop_reason: str | None = None

    def feed(self, line: str) -> dict | None:
        """Returns a record when the line completes one."""
        if m := _STOPPED.search(line):
            self.stop_reason = m.group(0)
            return None
        if m := _EVAL_START.search(line):
            self._flush_eval()
            self._eval_step, self._eval_loss = int(m["step"]), None
            return None
        if (m := _EVAL_STEP.search(line)) and self._eval_step is not None:
            self._eval_loss = float(m["loss"])
            return None
        if m := _STEP.search(line):
            rec_eval = self._flush_eval()
            step = int(m["step"])
            if self.first_step is None:
                self.first_step = step
            rec = {
                "kind": "train",
                "step": step,
                "loss": float(m["loss"]),
                "step_seconds": float(m["seconds"]),
                "tokens_per_s_per_device": float(m["tps"]),
                "tflops_per_device": float(m["tflops"]),
                "target_tokens": float(m["weights"]),
            }
            self.records.append(rec)
            return rec_eval or rec
        return None

    def _flush_eval(self) -> dict | None:
        if self._eval_step is None or self._eval_loss is None:
            return None
        rec = {"kind": "eval", "step": self._eval_step, "eval_loss": self._eval_loss}
        self.records.append(rec)
        self._eval_step = self._eval_loss = None
        return rec

    def finish(self) -> None:
        self._flush_eval()


def parse_log(path: Path, start: int = 0) -> LogParser:
    p = LogParser()
    with open(path, errors="replace") as f:
        f.seek(start)
        for line in f:
            p.feed(line)
    p.finish()
    return p


def write_jsonl(records: list[dict], path: Path) -> None:
    from pingctl.atomic import atomic_file

    with atomic_file(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict]:
    """Records of a metrics file; a damaged line (a crash mid-write) is an error naming it."""
    if not Path(path).exists():
        return []
    out = []
    for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or "kind" not in rec or "step" not in rec:
            raise PingctlError(f"{path}, line {n}: not a metrics record (cut by a crash?); "
                               "remove the line (train.log holds every step)")
        out.append(rec)
    return out


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """A resumed run repeats no step: later records of the same (kind, step) win."""
    by_key = {(r["kind"], r["step"]): r for r in old}
    by_key.update({(r["kind"], r["step"]): r for r in new})
    return sorted(by_key.values(), key=lambda r: (r["step"], r["kind"] != "train"))


def plot_loss(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pingctl.atomic import atomic_file

    train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    ev = [(r["step"], r["eval_loss"]) for r in records if r["kind"] == "eval"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1.2)
    if ev:
        ax.plot(*zip(*ev), "o-", label="eval loss", lw=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


# The first two steps of every invocation are warm-up, not throughput: step 0 compiles, and step 1
# was slow too, on CPU and on an H200 (`base` there: 2.7-3.1 s against 0.16-0.31 s for the steps
# after it; `small` on a 2-core CPU: 34 s against ~25 s). Counting step 1 understated the H200's
# rate by 18-29% in a 40-step benchmark.
WARMUP_STEPS = 2


def throughput(train: list[dict]) -> tuple[float, float | None]:
    """(tokens/s per device, mean seconds per step) of one invocation's train records after warm-up.

    Time-weighted: a mean of per-step rates would overweight the fast steps. Too short a run
    for that falls back to all but the first step, then to what there is."""
    steady = train[WARMUP_STEPS:] or train[1:] or train
    busy = sum(r["step_seconds"] for r in steady)
    tps = sum(r["tokens_per_s_per_device"] * r["step_seconds"] for r in steady) / busy if busy else 0.0
    return tps, (busy / len(steady) if steady else None)


GAP_WARN_NATS = 0.5


def generalization_gap(records: list[dict], window: int = 50) -> float | None:
    """Last eval loss minus the mean train loss of the `window` steps before that eval.

    A large gap means the model does better on the batches it trains on than on rows drawn
    elsewhere: overfitting, or train batches that do not represent the data (a first loader
    fed 32 probes for 128 steps at a time and showed 1.4 vs 2.9)."""
    ev = [r for r in records if r["kind"] == "eval"]
    if not ev:
        return None
    at = ev[-1]["step"]
    losses = [r["loss"] for r in records if r["kind"] == "train" and at - window < r["step"] <= at]
    if not losses:
        return None
    return float(ev[-1]["eval_loss"] - sum(losses) / len(losses))
