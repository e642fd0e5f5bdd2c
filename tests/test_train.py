"""Training through MaxText on CPU: tiny preset, checkpoints, resume, kill -9, targets."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import load_config
from pingctl.train import metrics as M
from pingctl.train.presets import PRESETS, architecture
from pingctl.train.render import parameters, render_maxtext

pytest.importorskip("maxtext")
runner = CliRunner()
TINY = ["--set", "loader.seq_len=128", "--set", "loader.batch_size=8", "--set", "train.eval_steps=4",
        "--set", "train.learning_rate=0.01"]


@pytest.fixture(scope="module")
def rows(synth_rows, time_split):
    from pingctl.records.build import build_rows
    from tests.conftest import build_once

    def build(d: Path) -> None:
        build_rows([time_split / "train"], d / "rtrain")
        build_rows([time_split / "val"], d / "rval")

    d = build_once(synth_rows / "timerows", build)
    return d / "rtrain", d / "rval"


def _train(args, **kw):
    return subprocess.run([sys.executable, "-m", "pingctl", "train", *args, "--json"], capture_output=True, text=True, **kw)


_PYCONFIG = """
import sys
import jax, numpy as np
from flax import nnx
from maxtext.configs import pyconfig
from maxtext.utils import model_creation_utils

def n_params(c):  # MaxText's own model, built abstractly (shapes only)
    _, model = model_creation_utils.create_nnx_abstract_model(c)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

n = int(sys.argv[1])
for f in sys.argv[2:2 + n]:
    c = pyconfig.initialize(["", f, "skip_jax_distributed_system=true"])
    print("pyconfig:", *(n_params(c) if a == "n_params" else getattr(c, a) for a in sys.argv[2 + n:]))
"""


def _pyconfig(texts: list[str], tmp_path: Path, *attrs: str) -> list[list[str]]:
    """The given attributes of the config MaxText's own pyconfig builds from each text (`n_params`:
    the parameter count of the model MaxText builds from it), all in one process (MaxText imports
    take ~6 s)."""
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"maxtext-{i}.yml")
        paths[-1].write_text(text)
    out = subprocess.run([sys.executable, "-c", _PYCONFIG, str(len(paths)), *map(str, paths), *attrs],
                         capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    values = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("pyconfig: ")]
    assert len(values) == len(paths) and all(len(v) == len(attrs) for v in values), out.stdout[-2000:]
    return values


@pytest.mark.slow
def test_every_preset_renders_a_config_maxtext_accepts(tmp_path, rows):
    # The last config resizes `tiny` through model.overrides, with fewer key/value heads than query
    # heads: the run summary's parameter count must follow the model MaxText really builds.
    resized = ("model.overrides={base_emb_dim: 96, base_num_decoder_layers: 3, base_num_query_heads: 4, "
               "base_num_kv_heads: 2, head_dim: 24, base_mlp_dim: 200}")
    cases = [(p, [f"model.preset={p}"]) for p in sorted(PRESETS)] + [("tiny", ["model.preset=tiny", resized])]
    cfgs = [load_config(None, [*o, f"train.train_rows={rows[0]}", "train.steps=5"]) for _, o in cases]
    texts = [render_maxtext(cfg, tmp_path / str(i)) for i, cfg in enumerate(cfgs)]
    got = _pyconfig(texts, tmp_path, "vocab_size", "emb_dim", "num_decoder_layers", "max_target_length", "dataset_type",
                    "n_params")
    for (preset, _), cfg, (vocab, emb, layers, seq, dtype, n) in zip(cases, cfgs, got, strict=True):
        arch = architecture(preset, cfg.model.overrides)
        assert (int(vocab), int(emb), int(layers), int(seq), dtype) == (267, arch["emb_dim"], arch["layers"], 1024,
                                                                        "DatasetType.GRAIN"), preset
        assert int(n) == parameters(cfg), (preset, cfg.model.overrides)
    assert architecture("tiny", cfgs[-1].model.overrides)["emb_dim"] == 96 != PRESETS["tiny"]["emb_dim"]


@pytest.mark.slow
def test_overrides_replace_template_keys_and_reach_maxtext(tmp_path, rows):
    # enable_dropout and dtype are also written by the template: the override must win, as the
    # only definition (MaxText's loader rejects duplicate keys; before, dropout_rate alone was inert)
    over = "model.overrides={enable_dropout: true, dropout_rate: 0.1, dtype: bfloat16, remat_policy: full}"
    cfg = load_config(None, ["model.preset=tiny", f"train.train_rows={rows[0]}", over])
    text = render_maxtext(cfg, tmp_path)
    live = [ln.split(":")[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert live.count("enable_dropout") == 1 and live.count("dtype") == 1 and live.count("remat_policy") == 1
    assert _pyconfig([text], tmp_path, "enable_dropout", "dropout_rate", "dtype", "remat_policy")[0] == [
        "True", "0.1", "bfloat16", "full"]


@pytest.mark.parametrize("key,field", [("max_target_length", "loader.seq_len"), ("learning_rate", "train.learning_rate")])
def test_overrides_of_keys_pingctl_derives_are_refused_with_the_field_to_use(key, field, tmp_path, rows):
    from pingctl.errors import PingctlError

    cfg = load_config(None, [f"train.train_rows={rows[0]}", f"model.overrides={{{key}: 7}}"])
    with pytest.raises(PingctlError, match=f"{key}: set {field}"):
        render_maxtext(cfg, tmp_path)
    r = _train([str(rows[0]), "--run-dir", str(tmp_path / "run"), "--set", f"model.overrides={{{key}: 7}}"])
    assert r.returncode != 0 and field in r.stdout + r.stderr and "Traceback" not in r.stderr


def test_resume_allows_training_only_overrides_and_refuses_another_model(rows, tmp_path):
    from pingctl.errors import PingctlError
    from pingctl.train.local import prepare_run

    run = tmp_path / "run"
    base = ["model.preset=tiny", f"train.train_rows={rows[0]}"]
    prepare_run(load_config(None, base), run)
    (run / "maxtext" / "checkpoints" / "9").mkdir(parents=True)
    (run / "maxtext" / "checkpoints" / "9" / "commit_success.txt").write_text("ok")
    dropout = "model.overrides={enable_dropout: true, dropout_rate: 0.1, adam_weight_decay: 0.2}"
    prepare_run(load_config(None, [*base, dropout]), run)  # same weights, trained differently from here
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["overrides"]["dropout_rate"] == 0.1
    for other in ("model.preset=small", "model.overrides={emb_dim: 96}", "loader.seq_len=256"):
        with pytest.raises(PingctlError, match="different model"):
            prepare_run(load_config(None, [*base, dropout, other]), run)


# The resume tests start from one 50-step run with evals, trained once per session (first50).
def _with_evals(rows, run: Path) -> list[str]:
    return [str(rows[0]), "--eval", str(rows[1]), "--run-dir", str(run), *TINY,
            "--set", "train.eval_interval=10", "--set", "train.checkpoint_period=25"]


@pytest.fixture(scope="module")
def first50(rows, synth_rows):
    """(run, its --json summary): the directory is shared; a test that trains on copies it."""
    from tests.conftest import build_once

    def build(d: Path) -> None:
        d.mkdir()
        r = _train([*_with_evals(rows, d / "run"), "--steps", "50"])
        assert r.returncode == 0, r.stderr[-3000:]
        (d / "first.json").write_text(r.stdout)

    d = build_once(synth_rows / "first50", build)
    return d / "run", json.loads((d / "first.json").read_text())


def test_tiny_trains_checkpoints_and_resumes(first50, rows, tmp_path):
    done, s = first50
    assert s["first_step_this_run"] == 0 and s["last_step"] == 49
    assert s["final_eval_loss"] < s["first_eval_loss"] - 1.0, s  # clearly learned something
    assert s["checkpoints"] == [0, 25, 49]
    assert s["generalization_gap"] is not None and isinstance(s["warnings"], list)
    assert (done / "maxtext" / "checkpoints" / "49" / "iter").is_dir()  # Grain iterator state saved
    assert list((done / "maxtext" / "tensorboard").rglob("events.out.tfevents.*"))
    assert (done / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("config.yaml", "maxtext.yml", "train.log", "metrics.jsonl", "summary.json"):
        assert (done / name).exists(), name
    assert 'attention: "dot_product"' in (done / "maxtext.yml").read_text()  # what `auto` renders
    waited = json.loads((done / "input_wait.json").read_text())
    assert waited["calls"] == 50  # one batch per train step (the eval batches are not counted)
    assert 0 < s["input_wait_s"] == pytest.approx(waited["steady_mean_s"]) and 0 < s["input_wait_share"] < 1
    assert "pingctl: train.attention=auto -> dot_product (1 cpu device(s))" in (done / "train.log").read_text()
    run = tmp_path / "run"  # a moved run directory resumes where it is now
    shutil.copytree(done, run)
    common = _with_evals(rows, run)
    second = _train([*common, "--steps", "60"])
    assert second.returncode == 0, second.stderr[-3000:]
    s2 = json.loads(second.stdout)
    assert s2["resumed_from_checkpoint"] == 49 and s2["first_step_this_run"] == 50 and s2["last_step"] == 59
    assert json.loads((run / "input_wait.json").read_text())["calls"] == 10  # this invocation's steps only
    rendered = (run / "maxtext.yml").read_text()
    assert f'base_output_directory: "{run}"' in rendered and str(done) not in rendered
    loss = {r["step"]: r["loss"] for r in M.read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}
    assert sorted(loss) == list(range(60))  # one record per step across both runs
    assert (s2["first_loss"], s2["final_loss"]) == (loss[50], loss[59])  # this run's, not the directory's
    again = _train([*common, "--steps", "60"])
    assert again.returncode == 1 and "already trained to step 60" in again.stderr


@pytest.mark.slow
def test_max_minutes_saves_the_step_at_the_deadline_and_the_rerun_resumes_there(rows, tmp_path):
    # The checkpoint period is far beyond what runs: the bound used to wait for the next periodic
    # checkpoint, so this run went on for 10,000 steps (and past the timeout) before stopping.
    run, minutes = tmp_path / "run", 0.5
    common = [str(rows[0]), "--run-dir", str(run), *TINY, "--set", "train.eval_interval=-1",
              "--set", "train.checkpoint_period=10000"]
    keep = ["--set", "loader.loss_keep={src: 0.5}"]  # also: a reweighted train loss gets no gap
    t0 = time.time()
    bounded = _train([*common, *keep, "--steps", "100000", "--max-minutes", str(minutes)], timeout=60 * minutes + 150)
    wall = time.time() - t0
    assert bounded.returncode == 0, bounded.stderr[-3000:]
    s = json.loads(bounded.stdout)
    assert s["generalization_gap"] is None and any("loss_keep" in w for w in s["warnings"])
    stop = s["stopped_early"]
    step = stop["step"]
    assert stop["reason"] == "time limit" and stop["max_minutes"] == minutes
    # committed; the only other checkpoint is MaxText's at the start (save_checkpoint_on_start)
    assert stop["checkpoint"] == step == s["last_step"] and s["checkpoints"] == sorted({0, step})
    step_s = {r["step"]: r["step_seconds"] for r in M.read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}
    if step > 0:  # the step before found the deadline ahead: late by the step in progress and its save only
        assert 0 < stop["overrun_s"] < step_s[step] + 10, (stop, step_s[step])
    # else the start-up outlasted the bound (a loaded machine) and the first step stopped: late by that much
    assert 0 < stop["overrun_s"] < 90 and wall < 60 * minutes + stop["overrun_s"] + 30, (stop, wall)
    assert json.loads((run / "stopped.json").read_text()) == stop
    # a process of its own: the width its console takes from COLUMNS keeps the line on one line
    shown = subprocess.run([sys.executable, "-m", "pingctl", "inspect", str(run)], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert shown.returncode == 0 and f"after the {minutes:g}-minute bound, at step {step}, checkpoint saved" in shown.stdout
    again = _train([*common, "--steps", str(step + 4)])
    assert again.returncode == 0, again.stderr[-3000:]
    s2 = json.loads(again.stdout)
    assert (s2["resumed_from_checkpoint"], s2["first_step_this_run"], s2["last_step"]) == (step, step + 1, step + 3)
    assert s2["stopped_early"] is None and not (run / "stopped.json").exists()
    trained = sorted(r["step"] for r in M.read_jsonl(run / "metrics.jsonl") if r["kind"] == "train")
    assert trained == list(range(step + 4))  # the stopped step's metrics too: it ended its step


def _fake_checkpointing(saved: set, period: int):
    """MaxText's `checkpointing` as the worker uses it, the state standing for its step: a save on
    the period (never step 0, as with save_checkpoint_on_start off), and without a step the forced
    end-of-training save of the state's step, which also skips step 0 and a step already saved."""
    from types import SimpleNamespace

    def maybe_save_checkpoint(manager, state, config, data_iterator, step=None):
        at = state if step is None else step
        if step is not None and at > 0 and at % period == 0:
            assert at not in saved, f"step {at} saved twice"
            saved.add(at)
        elif step is None and at > 0:
            saved.add(at)

    return SimpleNamespace(maybe_save_checkpoint=maybe_save_checkpoint, wait_until_finished=lambda manager: None,
                           all_steps=lambda manager: sorted(saved))


def test_time_bound_saves_the_first_step_past_the_deadline_then_ends_the_loop(tmp_path):
    from types import SimpleNamespace

    from pingctl.train.worker import TimeBound, _time_bounded

    config = SimpleNamespace(steps=100)

    class Batches:
        def __next__(self):
            return "batch"

    def steps(ckpt, at):
        for step in at:
            ckpt.maybe_save_checkpoint("manager", step, config, None, step)

    saved = set()
    ckpt = _fake_checkpointing(saved, period=10)
    bound = TimeBound(tmp_path, 1.0, started=time.time() - 30)  # 30 s to go
    bound.save_at_deadline(ckpt)
    it = _time_bounded(Batches, bound)()
    steps(ckpt, range(13))
    assert bound.stop_step is None and saved == {10} and not (tmp_path / "stopped.json").exists()
    assert next(it) == "batch"
    bound.deadline = time.time() - 2  # passed during step 13, well before the period's step 20
    steps(ckpt, [13])
    stop = json.loads((tmp_path / "stopped.json").read_text())
    assert bound.stop_step == 13 and saved == {10, 13}
    assert stop["step"] == stop["checkpoint"] == 13 and 2 <= stop["overrun_s"] < 10
    with pytest.raises(StopIteration, match="max_minutes=1 reached"):
        next(it)

    def first_stop(saved_steps: set, at) -> tuple[int | None, set]:
        saved = set(saved_steps)
        ckpt = _fake_checkpointing(saved, period=10)
        bound = TimeBound(tmp_path, 0.01, started=time.time() - 60)  # already past
        bound.save_at_deadline(ckpt)
        steps(ckpt, at)
        return bound.stop_step, saved

    assert first_stop(set(), range(3)) == (1, {1})  # step 0 cannot be saved: the next step stops
    assert first_stop({10}, [20]) == (20, {10, 20})  # a periodic step is saved once
    assert first_stop(set(), [99]) == (None, set())  # the last step: MaxText saves it, the run completes


def _losses(run: Path) -> dict[int, str]:
    text = (run / "train.log").read_text()
    return {int(a): b for a, b in re.findall(r"completed step: (\d+),.*? loss: ([\d.]+)", text)}


def test_kill_9_then_rerun_continues_at_the_same_data_position(first50, rows, tmp_path):
    ref, _ = first50  # the same command, never interrupted
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "pingctl", "train", *_with_evals(rows, run), "--steps", "50", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = run / "maxtext" / "checkpoints" / "25" / "commit_success.txt"
    deadline = time.time() + 240
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert ckpt.exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    assert subprocess.run(["pgrep", "-f", f"pingctl.train.worker {run}"], capture_output=True).returncode == 1
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    s = json.loads(again.stdout)
    assert s["resumed_from_checkpoint"] >= 25 and s["last_step"] == 49
    want, got = _losses(ref), _losses(run)
    resumed = range(s["first_step_this_run"], 50)
    assert len(resumed) >= 5 and [got[k] for k in resumed] == [want[k] for k in resumed]  # same batches, same updates


def test_modal_app_builds_offline(rows, tmp_path):
    from pingctl.executor.modal.app import build_app, remote_config

    cfg = load_config(None, [f"train.train_rows={rows[0]}", f"train.eval_rows={rows[1]}",
                             "train.modal.gpu=A100", "train.modal.gpu_count=2"])
    app_, fn, volume, image = build_app(cfg, "r1")
    assert app_.name == "pingctl-train" and callable(fn.remote)
    rc = remote_config(cfg, "r1")
    assert rc.train.run_dir == "/data/runs/r1" and rc.train.hardware == "gpu"
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(tmp_path / "m"), "--target", "modal",
                            "--dry-run", "--json"], env={"MODAL_TOKEN_ID": "", "WANDB_API_KEY": "secret-value"})
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["modal"]["gpu"] == "H100:1" and res["run_dir"] == f"/data/runs/{res['name']}"
    assert res["name"].startswith("m-")  # the directory's name and a hash of its path (test_train_modal.py)
    staged = (tmp_path / "m" / "modal" / "config.yaml").read_text() + (tmp_path / "m" / "modal" / "maxtext.yml").read_text()
    assert "secret-value" not in staged and "secret-value" not in r.output


def test_log_parser_pairs_eval_with_its_train_step():
    lines = [
        "I1 train.py:917] Starting eval after train step 10",
        "I1 metric_logger.py:328] Completed eval step: 0, seconds: 0.03, running loss=3.500, running perplexity=3",
        "I1 metric_logger.py:328] Completed eval step: 1, seconds: 0.03, running loss=3.250, running perplexity=3",
        "I1 metric_logger.py:265] completed step: 10, seconds: 0.087, TFLOP/s/device: 0.010, "
        "Tokens/s/device: 11768.897, total_weights: 955, loss: 4.239, lm_loss: 4.239, perplexity: 69.367",
    ]
    p = M.LogParser()
    for line in lines:
        p.feed(line)
    p.finish()
    assert p.records == [
        {"kind": "eval", "step": 10, "eval_loss": 3.25},
        {"kind": "train", "step": 10, "loss": 4.239, "step_seconds": 0.087, "tokens_per_s_per_device": 11768.897,
         "tflops_per_device": 0.01, "target_tokens": 955.0},
    ]


@pytest.mark.parametrize("requested, platform, devices, kernel", [
    ("auto", "gpu", 1, "flash"),            # segment-masked Pallas-Triton: 2x dot_product on an H200
    ("auto", "gpu", 8, "dot_product"),      # MaxText calls the flash kernel without a sharding rule
    ("auto", "cpu", 1, "dot_product"),      # on CPU MaxText's flash means TPU kernels
    ("auto", "tpu", 4, "dot_product"),
    ("cudnn_flash_te", "gpu", 8, "cudnn_flash_te"),  # an explicit choice is kept
    ("dot_product", "gpu", 1, "dot_product"),
])
def test_auto_attention_is_flash_only_on_a_job_of_one_gpu(requested, platform, devices, kernel):
    from pingctl.train.render import attention_kernel

    assert attention_kernel(requested, platform, devices) == kernel


def test_throughput_leaves_out_both_warm_up_steps():
    # The shape of a 40-step H200 run: compilation in step 0, a slow step 1, then steady steps.
    secs = [3.7, 2.7] + [0.16] * 38
    recs = [{"kind": "train", "step": k, "step_seconds": s, "tokens_per_s_per_device": 65536 / s}
            for k, s in enumerate(secs)]
    tps, step_s = M.throughput(recs)
    assert tps == pytest.approx(65536 / 0.16) and step_s == pytest.approx(0.16)
    # Short runs fall back to what there is rather than reporting nothing.
    assert M.throughput(recs[:2])[1] == pytest.approx(2.7)
    assert M.throughput(recs[:1])[1] == pytest.approx(3.7)
    assert M.throughput([]) == (0.0, None)


def test_input_waits_are_summed_and_described_after_warm_up(tmp_path):
    from pingctl.artifacts.run import input_wait_summary
    from pingctl.train.worker import InputWaits, WAIT_WRITE_EVERY, _then, _timed

    got = input_wait_summary([5.0, 1.0, 0.1, 0.3, 0.2, 0.4], warmup=2)
    assert got["calls"] == 6 and got["warmup"] == 2 and got["seconds_total"] == pytest.approx(7.0)
    assert got["steady_mean_s"] == pytest.approx(0.25) and got["steady_median_s"] == pytest.approx(0.25)
    assert got["steady_max_s"] == pytest.approx(0.4) and got["steady_p90_s"] == pytest.approx(0.37)
    assert input_wait_summary([2.0], warmup=2)["steady_mean_s"] == pytest.approx(2.0)  # what there is

    path = tmp_path / "input_wait.json"
    path.write_text("{}")  # an earlier invocation's
    waits = InputWaits(tmp_path, warmup=2)
    assert not path.exists()

    class Batches:  # stands in for MaxText's iterator: each batch takes 10 ms to come
        def __init__(self):
            self.n = 0

        def __next__(self):
            time.sleep(0.01)
            self.n += 1
            return self.n

    it = _timed(Batches, waits)()
    assert [next(it) for _ in range(4)] == [1, 2, 3, 4]  # the batches themselves, untouched
    assert not path.exists()
    next(it)  # the fifth: written after the first few, to be seen early
    assert json.loads(path.read_text())["calls"] == 5
    for _ in range(WAIT_WRITE_EVERY - 5 - 1):
        next(it)
    assert json.loads(path.read_text())["calls"] == 5
    next(it)
    seen = json.loads(path.read_text())
    assert seen["calls"] == WAIT_WRITE_EVERY and 0.01 <= seen["steady_median_s"] < 0.1

    def loop(argv):
        next(it)
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        _then(loop, waits.write)([])
    assert json.loads(path.read_text())["calls"] == WAIT_WRITE_EVERY + 1  # written however the loop ends


def test_generalization_gap_compares_the_last_eval_with_the_steps_before_it():
    recs = [{"kind": "train", "step": k, "loss": 4.0 if k < 40 else 2.0} for k in range(100)]
    recs += [{"kind": "eval", "step": 50, "eval_loss": 3.0}, {"kind": "eval", "step": 99, "eval_loss": 2.9}]
    assert M.generalization_gap(recs, window=50) == pytest.approx(0.9)  # steps 50..99 all at 2.0
    # steps 31..50: 9 x 4.0 + 11 x 2.0 -> mean 2.9
    assert M.generalization_gap(recs[:100] + recs[100:101], window=20) == pytest.approx(0.1)
    assert M.generalization_gap(recs[:100]) is None  # no eval


@pytest.mark.slow
def test_damaged_rows_fail_the_run_instead_of_ending_it_quietly(rows, tmp_path):
    """MaxText ends its step loop on a data-iterator exception and exits 0; pingctl must not call
    that a finished run (no summary.json, the completion marker) and must say why."""
    import shutil

    for damage, expected in (("truncate", "unreadable ArrayRecord file"), ("flip", "training ended before its first step")):
        bad = tmp_path / damage
        shutil.copytree(rows[0], bad)
        f = next(bad.glob("*.arrayrecord"))
        data = bytearray(f.read_bytes())
        if damage == "truncate":
            data = data[:3000]
        else:  # chunk bodies, not the footer: the file opens, its records do not decode
            for i in range(4096, int(len(data) * 0.6)):
                data[i] ^= 0x5A
        f.write_bytes(bytes(data))
        run = tmp_path / f"run-{damage}"
        r = _train([str(bad), "--run-dir", str(run), *TINY, "--set", "train.eval_interval=-1", "--steps", "3"])
        assert r.returncode == 1 and expected in r.stderr, r.stderr[-3000:]
        assert "Traceback" not in r.stderr and not (run / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["cpu", "gpu"])
@pytest.mark.parametrize("given", [None, "", " "])
def test_xla_flags_we_set_are_ones_xla_accepts(hardware, given):
    # XLA reads a value not starting with "--" as a flag-file name and aborts the process.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if given is not None:
        env["XLA_FLAGS"] = given
    env["JAX_PLATFORMS"] = "cpu"
    code = (
        "import os; from pingctl.train.xla import set_xla_flags; "
        f"set_xla_flags({hardware!r}); import jax; print(int((jax.numpy.ones(2) + 1).sum())); "
        "print(os.environ['XLA_FLAGS'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    total, flags = out.stdout.split("\n")[:2]
    assert total == "4" and flags.startswith("--")


def test_xla_flags_the_user_set_are_kept(monkeypatch):
    from pingctl.train.xla import set_xla_flags

    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/mine")
    set_xla_flags("gpu")
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/mine"


def _fake_run(rows, run: Path, step: int = 9) -> list[str]:
    from pingctl.train.local import prepare_run

    base = ["model.preset=tiny", f"train.train_rows={rows[0]}", "train.steps=20"]
    prepare_run(load_config(None, base), run)
    (run / "maxtext" / "checkpoints" / str(step)).mkdir(parents=True)
    (run / "maxtext" / "checkpoints" / str(step) / "commit_success.txt").write_text("ok")
    return base


def test_a_refused_train_command_changes_nothing_on_disk(rows, tmp_path):
    from pingctl.errors import PingctlError
    from pingctl.train.local import prepare_run

    run = tmp_path / "run"
    base = _fake_run(rows, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    refused = [
        ([*base, "train.steps=5"], False, "already trained to step 10"),
        ([*base, "model.overrides={steps: 5}"], True, "may not set steps"),
        ([*base, "loader.loss_keep={rtt: 0.5}"], True, "unknown field"),
        ([*base, "model.preset=small"], False, r"different model \(model.preset: 'tiny' -> 'small'\)"),
    ]
    for overrides, fresh, match in refused:
        with pytest.raises(PingctlError, match=match):
            prepare_run(load_config(None, overrides), run, fresh=fresh)
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # a dry run of a fresh start neither deletes the run nor rewrites its config
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(run), "--target", "slurm", "--dry-run",
                            "--fresh", "--steps", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_fresh_refuses_what_is_not_a_run_and_run_dirs_that_hold_the_rows(rows, tmp_path):
    notes = tmp_path / "precious"
    notes.mkdir()
    (notes / "notes.txt").write_text("keep me")
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(notes), "--fresh", "--steps", "3"])
    assert r.exit_code == 2 and "not a pingctl run directory" in r.output
    assert (notes / "notes.txt").read_text() == "keep me"
    for run in (rows[0], rows[0].parent, rows[0] / "sub"):
        r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(run), "--fresh", "--steps", "3"])
        assert r.exit_code == 2 and "overlaps the rows" in r.output
        assert "raw MaxText log" not in r.output  # no live view for a command refused before training
    assert (rows[0] / "manifest.json").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(afile), "--steps", "3"])
    assert r.exit_code == 2 and "is a file" in r.output


def test_the_live_view_opens_only_after_the_pre_flight_checks(tmp_path, capsys):
    from pingctl.cli.train_cmd import _with_live_view
    from pingctl.config import Config
    from pingctl.errors import PingctlError

    def refused(cfg, run, fresh, on_record, on_start):
        raise PingctlError("refused before training")

    def trains(cfg, run, fresh, on_record, on_start):
        on_start(run)
        on_record({"kind": "train", "step": 0, "loss": 4.0, "tokens_per_s_per_device": 100.0})
        on_record({"kind": "eval", "step": 0, "eval_loss": 3.5})
        return {"steps": 1}

    with pytest.raises(PingctlError):
        _with_live_view(Config(), tmp_path, False, refused)
    assert "raw MaxText log" not in capsys.readouterr().err
    assert _with_live_view(Config(), tmp_path, False, trains) == {"steps": 1}
    assert f"run dir {tmp_path}" in capsys.readouterr().err.replace("\n", "")


def test_a_damaged_run_config_is_named_instead_of_resumed(rows, tmp_path):
    from pingctl.errors import PingctlError
    from pingctl.train.local import prepare_run

    run = tmp_path / "run"
    base = _fake_run(rows, run)
    for text in ("", "model: {preset: tiny}\n", "[1, 2]\n"):
        (run / "config.yaml").write_text(text)
        with pytest.raises(PingctlError, match="config.yaml: missing or damaged"):
            prepare_run(load_config(None, [*base, "train.steps=40"]), run)


def test_rows_without_records_are_refused_before_training(rows, tmp_path):
    from pingctl.errors import PingctlError
    from pingctl.train.local import check_inputs

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text(json.dumps({"files": [], "record_measurements": []}))
    with pytest.raises(PingctlError, match="no records"):
        check_inputs(load_config(None, [f"train.train_rows={empty}"]))
    (empty / "manifest.json").write_text(json.dumps({"files": [], "record_measurements": None}))
    with pytest.raises(PingctlError, match="malformed"):
        check_inputs(load_config(None, [f"train.train_rows={empty}"]))


def test_slurm_cpu_jobs_reserve_no_gpus_and_paths_with_spaces_are_refused(rows, tmp_path):
    run = tmp_path / "cpu"
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(run), "--target", "slurm", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert not any(l.startswith("#SBATCH --gpus") for l in (run / "train.sbatch").read_text().splitlines())
    r = runner.invoke(app, ["train", str(rows[0]), "--run-dir", str(tmp_path / "a b"), "--target", "slurm", "--dry-run"])
    assert r.exit_code == 2 and "without spaces" in r.output and not (tmp_path / "a b").exists()


@pytest.mark.slow
def test_ctrl_c_keeps_the_metrics_of_the_steps_already_run(rows, tmp_path):
    run = tmp_path / "int"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pingctl", "train", str(rows[0]), "--run-dir", str(run), "--steps", "400",
         *TINY, "--set", "train.checkpoint_period=10", "--set", "train.eval_interval=-1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpt = run / "maxtext" / "checkpoints" / "20" / "commit_success.txt"

    def step_20_logged() -> bool:
        # MaxText logs a step's metrics after the next step (and may commit its checkpoint
        # first): interrupt only once step 20 is in the log, or there is nothing to keep
        log = run / "train.log"
        return log.exists() and any(r["kind"] == "train" and r["step"] >= 20 for r in M.parse_log(log).records)

    deadline = time.time() + 240
    while not (ckpt.exists() and step_20_logged()) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert ckpt.exists()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    steps = {r["step"] for r in M.read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"}
    assert set(range(0, 21)) <= steps
    # inspect reads the log too: a run in progress (no metrics.jsonl yet) shows its steps
    (run / "metrics.jsonl").rename(run / "kept.jsonl")
    r = runner.invoke(app, ["inspect", str(run), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["last_step"] >= 20
    (run / "kept.jsonl").rename(run / "metrics.jsonl")
    # a line cut by a crash mid-write is named, not a traceback
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 3, "lo')
    r = runner.invoke(app, ["inspect", str(run)])
    assert r.exit_code == 1 and "metrics.jsonl, line" in r.output


def _events(path: Path, suffix: str, steps, loss, evals=()) -> None:
    """An events file as MaxText writes one per invocation (the tags pingctl reads, and one it does not)."""
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(path), filename_suffix=suffix)
    for step in steps:
        for tag, v in (("learning/loss", loss(step)), ("learning/total_weights", 900.0), ("learning/perplexity", 9.0),
                       ("perf/step_time_seconds", 0.5), ("learning/current_learning_rate", 0.01),
                       ("perf/per_device_tflops_per_sec", 0.02), ("perf/per_device_tokens_per_sec", 2048.0)):
            w.add_scalar(tag, v, step)
        if step in evals:
            w.add_scalar("eval/avg_loss", 3.0 + step / 100, step)
    w.close()


def test_event_files_give_each_step_once_the_later_invocation_winning(tmp_path):
    tb = tmp_path / "maxtext" / "tensorboard" / "maxtext"
    _events(tb, ".1", range(0, 13), lambda s: 5.0, evals=(0, 10))  # killed at 12, checkpoint 10
    _events(tb, ".2", range(11, 15), lambda s: 4.0, evals=(12,))  # resumed from 10
    recs = M.tensorboard_records(tmp_path / "maxtext" / "tensorboard")
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(15))
    assert [r["loss"] for r in train] == [5.0] * 11 + [4.0] * 4  # the re-run steps replace the killed run's
    assert train[0] == {"kind": "train", "step": 0, "loss": 5.0, "step_seconds": 0.5, "tokens_per_s_per_device": 2048.0,
                        "tflops_per_device": 0.02, "target_tokens": 900.0, "learning_rate": 0.01}
    assert [(r["step"], r["eval_loss"]) for r in recs if r["kind"] == "eval"] == [(0, 3.0), (10, 3.1), (12, 3.12)]
    assert M.run_history(tmp_path) == recs
    # a file whose writer was killed mid-record: what precedes the cut is read, the torn step is left out
    late = next(tb.glob("*.2"))
    late.write_bytes(late.read_bytes()[:-7])
    steps = [r["step"] for r in M.tensorboard_records(tb) if r["kind"] == "train"]
    assert steps == list(range(14))


def test_a_step_logged_but_stopped_before_its_events_stays_in_the_history(tmp_path):
    """MaxText logs a step, then writes its events: a worker stopped between the two (what a
    Ctrl-C on a loaded machine did at step 20) must not lose the step the log showed."""
    tb = tmp_path / "maxtext" / "tensorboard" / "maxtext"
    _events(tb, ".1", range(0, 20), lambda s: 5.0)
    line = ("completed step: {}, seconds: 0.500, TFLOP/s/device: 0.020, Tokens/s/device: 2048.000, "
            "total_weights: 900, loss: {}")
    log = M.LogParser()
    for step in range(0, 21):
        log.feed(line.format(step, 4.0))
    log.finish()
    train = [r for r in M.run_history(tmp_path, log.records) if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(21))
    assert [r["loss"] for r in train] == [5.0] * 20 + [4.0]  # the events win where they have the step
    assert [r["step"] for r in M.run_history(tmp_path)] == list(range(20))  # no log given: the events alone


@pytest.mark.slow
def test_kill_9_then_rerun_keeps_the_killed_invocations_metrics(rows, tmp_path):
    # metrics.jsonl and loss.png must cover every step of a run across a kill -9 and a resume, not
    # only the steps of the invocation that finished it.
    from pingctl.inspect.run import describe_run

    run, steps = tmp_path / "killed", 150
    cmd = [sys.executable, "-m", "pingctl", "train", str(rows[0]), "--eval", str(rows[1]), "--run-dir", str(run),
           "--steps", str(steps), *TINY, "--set", "train.checkpoint_period=20", "--set", "train.eval_interval=15",
           "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = run / "maxtext" / "checkpoints" / "20" / "commit_success.txt"

    def logged_past(step: int) -> bool:  # MaxText writes a step's metrics after the next step
        log = run / "train.log"
        return log.exists() and any(r["step"] > step for r in M.parse_log(log).records if r["kind"] == "train")

    deadline = time.time() + 240
    while not (ckpt.exists() and logged_past(21)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ckpt.exists() and proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    assert not (run / "metrics.jsonl").exists()
    # the killed invocation's steps survive in its TensorBoard events, up to and past the checkpoint:
    # `pingctl inspect` sees them without train.log (as for a SLURM or Modal run)
    (run / "train.log").rename(run / "train.log.aside")
    killed = describe_run(run)
    (run / "train.log.aside").rename(run / "train.log")
    assert killed["last_step"] >= 21 and killed["eval_step_last"] == 15 and not killed["complete"]
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    s = json.loads(again.stdout)
    c = s["resumed_from_checkpoint"]
    assert c >= 20 and s["first_step_this_run"] == c + 1 and s["last_step"] == steps - 1
    records = M.read_jsonl(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(steps))  # every step exactly once, across the kill
    evals = [r["step"] for r in records if r["kind"] == "eval"]
    assert evals == list(range(0, steps, 15))
    loss = {r["step"]: r["loss"] for r in train}
    assert (s["first_loss"], s["final_loss"]) == (loss[c + 1], loss[steps - 1])  # this invocation's
    log = _losses(run)  # the rerun's log lines agree with the records of the steps it re-ran
    assert all(abs(float(log[k]) - loss[k]) < 1e-3 for k in range(c + 1, steps))
    d = describe_run(run)
    assert d["complete"] and d["last_step"] == steps - 1 and d["eval_step_last"] == evals[-1]
    assert d["train_loss_last"] == pytest.approx(sum(loss[k] for k in range(steps - 20, steps)) / 20)
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
