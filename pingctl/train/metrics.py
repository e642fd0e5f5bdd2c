"""A run's metrics -> `metrics.jsonl`, and the loss-curve PNG.

The source is MaxText's TensorBoard event files (RUN/maxtext/tensorboard/), which it writes on
every target and which the worker flushes at every step (worker.py), so they keep the steps of
an invocation killed with -9. One events file per invocation; a later file replaces the records
of the earlier ones from its first step on (the steps re-run after a resume). The log parser
below remains for the live view, the reason MaxText gives for leaving its loop, and runs whose
event files cannot be read (tensorboard not installed; runs older than the per-step flush).
MaxText's own `metrics_file` is unusable: it truncates itself whenever an eval restarts its
step counter.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from pingctl.artifacts.run import LOG, METRICS, tensorboard_dir
from pingctl.atomic import atomic_file
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


# MaxText's TensorBoard scalars (maxtext/common/metric_logger.py) -> record fields. A train
# record needs every required tag, as a log line carries them all (a step cut short by a kill
# is left out; so are batch-rampup steps, which have no throughput, as in the log).
_TRAIN_TAGS = {
    "learning/loss": "loss",
    "perf/step_time_seconds": "step_seconds",
    "perf/per_device_tokens_per_sec": "tokens_per_s_per_device",
    "perf/per_device_tflops_per_sec": "tflops_per_device",
    "learning/total_weights": "target_tokens",
}
_TRAIN_EXTRA_TAGS = {"learning/grad_norm": "grad_norm", "learning/current_learning_rate": "learning_rate"}
_EVAL_TAG = "eval/avg_loss"  # written once per evaluation, at the train step it followed


def _event_pb2():
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        try:
            from tensorboardX.proto import event_pb2
        except ImportError:
            return None
    return event_pb2


def _events(path: Path, event_pb2):
    """The events of one file, stopping at a record cut short (a file still being written, or
    one whose writer was killed). TFRecord framing read here: tensorboard's own loader checks
    CRCs in Python and is ~10x slower, which `pingctl inspect` would feel on a long run."""
    from google.protobuf.message import DecodeError

    with open(path, "rb") as f:
        while len(head := f.read(12)) == 12:  # length (u64), its CRC, data, the data's CRC
            (n,) = struct.unpack_from("<Q", head)
            body = f.read(n + 4)
            if len(body) < n + 4:
                return
            try:
                yield event_pb2.Event.FromString(body[:n])
            except DecodeError:
                return


def _value(v) -> float:
    return float(f"{v:.7g}")  # float32 in the file: its digits, not the double's


def _file_records(path: Path, event_pb2) -> tuple[float, list[dict]]:
    """(when the file was started, its records sorted by step)."""
    started = None
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    for e in _events(path, event_pb2):
        if started is None:
            started = e.wall_time
        for v in e.summary.value:
            if v.WhichOneof("value") != "simple_value":
                continue
            step = int(e.step)
            if v.tag in _TRAIN_TAGS or v.tag in _TRAIN_EXTRA_TAGS:
                field = _TRAIN_TAGS.get(v.tag) or _TRAIN_EXTRA_TAGS[v.tag]
                train.setdefault(step, {"kind": "train", "step": step})[field] = _value(v.simple_value)
            elif v.tag == _EVAL_TAG:
                evals[step] = {"kind": "eval", "step": step, "eval_loss": _value(v.simple_value)}
    fields = [*_TRAIN_TAGS.values(), *_TRAIN_EXTRA_TAGS.values()]
    records = [{"kind": "train", "step": r["step"], **{f: r[f] for f in fields if f in r}}
               for r in train.values() if all(f in r for f in _TRAIN_TAGS.values())]
    records += evals.values()
    return (started or 0.0), _sorted(records)


def _sorted(records) -> list[dict]:
    return sorted(records, key=lambda r: (r["step"], r["kind"] != "train"))


def tensorboard_records(tb_dir: Path) -> list[dict]:
    """The train and eval records of a run's TensorBoard event files, one per (kind, step).

    Each invocation of a run writes its own file. Files are taken in the order they were
    started, and each replaces what the earlier ones hold from its first step on: the steps an
    invocation re-ran after resuming from a checkpoint, and any an earlier one logged past it."""
    event_pb2 = _event_pb2()
    tb_dir = Path(tb_dir)
    if event_pb2 is None or not tb_dir.is_dir():
        return []
    files = [_file_records(p, event_pb2) for p in sorted(tb_dir.rglob("events.out.tfevents.*")) if p.is_file()]
    history: list[dict] = []
    for _, records in sorted((f for f in files if f[1]), key=lambda f: f[0]):
        first = records[0]["step"]
        history = [r for r in history if r["step"] < first] + records
    return _sorted(history)


def run_history(run: Path, log_records: list[dict] | None = None) -> list[dict]:
    """Every train and eval record of a run across its invocations, one per (kind, step).

    From the TensorBoard events when they hold any, plus the records of `log_records` (those
    of the invocation that just ended) past the events' last step; otherwise (see the module
    docstring) metrics.jsonl merged with `log_records`, by default those of the whole train.log.

    MaxText logs a step's line before it writes the step's events (MetricLogger.write_metrics:
    log_metrics, then write_metrics_to_tensorboard), so a worker stopped between the two (Ctrl-C,
    which terminates it; a kill; a preemption) leaves its last step in train.log only: the
    log's record stands in for it, or the run's history would lack a step its log and the live
    view showed."""
    run = Path(run)
    records = tensorboard_records(tensorboard_dir(run))
    if records:
        last = records[-1]["step"]
        return merge(records, [r for r in log_records or () if r["step"] > last])
    if log_records is None:
        log_records = parse_log(run / LOG).records if (run / LOG).exists() else []
    return merge(read_jsonl(run / METRICS), log_records)


def plot_loss(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
