"""`pingctl export`: a model directory that answers as its run did, without the run."""

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.errors import PingctlError, UsageError

runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """The tiny run exported once (latest step) through the CLI: (export dir, --json summary)."""
    out = tmp_path_factory.mktemp("export") / "model"
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


@pytest.fixture(scope="module")
def models(tiny_run, exported):
    from pingctl.infer.model import LoadedModel

    return LoadedModel.load(tiny_run), LoadedModel.load(exported[0])


def _pairs(synth_rows, n: int = 3) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    t = pq.read_table(synth_rows / "synth" / "part-00000.parquet", columns=["src_addr", "dst_addr"])
    seen = list(dict.fromkeys(zip(t.column("src_addr").to_pylist(), t.column("dst_addr").to_pylist())))
    return seen[:: max(1, len(seen) // n)][:n]


def test_the_export_holds_config_weights_and_card(exported, tiny_run):
    from pingctl.artifacts import export as EX
    from pingctl.artifacts.run import checkpoint_steps, is_run_dir, model_dir_kind, run_config

    out, summary = exported
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert not is_run_dir(out) and model_dir_kind(out) == "export" and model_dir_kind(tiny_run) == "run"
    config = EX.read_config(out)
    latest = checkpoint_steps(tiny_run)[-1]
    assert config["format_version"] == EX.FORMAT_VERSION and config["source"]["steps"] == [latest]
    assert summary["steps"] == [latest] and summary["bytes"] == sum(f.stat().st_size for f in out.iterdir())
    net = config["architecture"]["maxtext"]
    assert net["base_emb_dim"] == 64 and net["base_num_decoder_layers"] == 2 and net["max_target_length"] == 256
    assert not {"grain_train_files", "base_output_directory", "learning_rate"} & set(net)  # the run's, not the net's
    assert config["vocab"]["size"] == net["vocab_size"] and config["loader"]["seq_len"] == 256
    # run_config reads an export through the config it embeds: what check_run and sample see
    assert run_config(out) == run_config(tiny_run)
    card = (out / "README.md").read_text()
    assert "preset `tiny`" in card and "| step | train loss" in card and f"step {latest}" in card


def test_the_weights_are_the_checkpoints_parameters_as_trained(exported, models):
    from pingctl.artifacts import export as EX

    run_model, _ = models
    on_disk = EX.read_tensors(exported[0])
    restored = run_model.weights()
    assert sorted(on_disk) == sorted(restored) and len(on_disk) == exported[1]["tensors"]
    assert any(".layers." in name for name in on_disk)  # the nnx path, joined by dots
    for name, a in restored.items():
        assert on_disk[name].dtype == a.dtype and np.array_equal(on_disk[name], a), name
    # the parameters and nothing else (no optimizer state): as many numbers as the preset has weights
    assert sum(t.size for t in on_disk.values()) == json.loads((exported[0] / "config.json").read_text())[
        "architecture"]["parameters"]


def test_the_export_answers_as_the_run(models, synth_rows):
    from pingctl.infer import queries as Q

    run_model, export_model = models
    assert export_model.steps == run_model.steps and export_model.seq_len == run_model.seq_len
    prompts = [Q.query_prefix(s, d, None, np.zeros(0, np.int32), None) for s, d in _pairs(synth_rows)]
    for a, b in zip(Q.rtt_distributions(run_model, prompts), Q.rtt_distributions(export_model, prompts)):
        assert b.p_fail == pytest.approx(a.p_fail, abs=1e-6)
        np.testing.assert_allclose(b.probs, a.probs, atol=1e-6)
        assert [b.quantile(q) for q in Q.QUANTILES] == [a.quantile(q) for q in Q.QUANTILES]


def test_sample_of_the_export_prints_the_runs_answer(tiny_run, exported, pair):
    args = ["--src", pair[0], "--dst", pair[1], "--json"]
    a = runner.invoke(app, ["sample", str(tiny_run), *args])
    b = runner.invoke(app, ["sample", str(exported[0]), *args])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert rb.pop("run") == str(exported[0].resolve()) and ra.pop("run") == str(tiny_run.resolve())
    assert ra == rb
    # the export holds one step's weights: another --step is a usage error, not a silent answer
    r = runner.invoke(app, ["sample", str(exported[0]), *args, "--step", "0"])
    assert r.exit_code == 2 and "holds only those weights" in r.output


def test_inspect_describes_the_export(exported, tiny_run):
    out, summary = exported
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "export" and d["preset"] == "tiny" and d["tensors"] == summary["tensors"]
    assert d["source_run"] == str(tiny_run.resolve()) and d["tensor_dtypes"] == {"F32": summary["tensors"]}
    assert d["elements"] == json.loads((out / "config.json").read_text())["weights"]["elements"]
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0 and "export:" in r.output and "tiny / " in r.output


def _rewrite(src, dst, change):
    """A copy of export `src` at `dst` whose tensors went through `change(dict)`."""
    from safetensors.numpy import save_file

    from pingctl.artifacts import export as EX

    shutil.copytree(src, dst)
    tensors = dict(EX.read_tensors(src))
    change(tensors)
    save_file(tensors, str(dst / EX.WEIGHTS))
    return dst


def test_a_mismatched_or_damaged_weights_file_is_named(exported, models, tmp_path, pair):
    from pingctl.artifacts import export as EX
    from pingctl.infer.weights import assign

    out = exported[0]
    tensors = dict(EX.read_tensors(out))
    first = min(tensors)
    ask = ["--src", pair[0], "--dst", pair[1]]

    def reshape(t):
        t[first] = np.zeros((*t[first].shape, 2), t[first].dtype)

    bad = _rewrite(out, tmp_path / "shape", reshape)
    r = runner.invoke(app, ["sample", str(bad), *ask])
    assert r.exit_code == 1 and f"tensor {first} has shape" in r.output and "Traceback" not in r.output, r.output
    # every other mismatch is found by the same check, before any weight is replaced
    state, before = models[1]._state, models[1].weights()
    for change, why in ((lambda t: t.update({first: t[first].astype(np.float16)}), f"tensor {first} is float16"),
                        (lambda t: t.pop(first), f"tensor {first} is missing"),
                        (lambda t: t.update({"decoder.extra.kernel": t[first]}), "tensor decoder.extra.kernel is not")):
        changed = dict(tensors)
        change(changed)
        with pytest.raises(PingctlError, match=why):
            assign(state, changed, out / EX.WEIGHTS)
    assert all(np.array_equal(a, models[1].weights()[k]) for k, a in before.items())
    cut = tmp_path / "cut"
    shutil.copytree(out, cut)
    data = (cut / EX.WEIGHTS).read_bytes()
    (cut / EX.WEIGHTS).write_bytes(data[: len(data) // 2])
    r = runner.invoke(app, ["sample", str(cut), *ask])
    assert r.exit_code == 1 and "model.safetensors: not a readable safetensors file" in r.output, r.output


def test_an_averaged_export_with_its_calibration(tiny_run, tmp_path):
    """--step A,B averages as `sample --step A,B` does; --calibration travels with the export and
    still fits it (a map fitted on a run fits that run's export)."""
    from pingctl.artifacts import export as EX
    from pingctl.artifacts.run import checkpoint_steps
    from pingctl.infer import calibration as CAL
    from pingctl.infer.model import LoadedModel

    steps = checkpoint_steps(tiny_run)[-2:]
    assert len(steps) == 2
    cal = CAL.save(CAL.fit(np.random.default_rng(0).uniform(size=200) ** 2,
                           {"run": str(tiny_run), "steps": steps, "context_policy": "none"}), tmp_path / "cal.json")
    out = tmp_path / "averaged"
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(out), "--step", ",".join(map(str, steps)),
                            "--calibration", str(cal), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == steps and EX.read_config(out)["calibration"] == "calibration.json"
    averaged = LoadedModel.load(tiny_run, steps).weights()
    on_disk = EX.read_tensors(out)
    assert all(np.array_equal(on_disk[k], a) for k, a in averaged.items())
    # what `sample EXPORT --calibration EXPORT/calibration.json` checks: it fits the export's weights
    shipped = CAL.load(out / "calibration.json")
    CAL.check_fits(shipped, out, EX.source_steps(EX.read_config(out)))
    with pytest.raises(UsageError, match="fitted for step"):
        CAL.check_fits(shipped, out, steps[-1:])
    # a map of another checkpoint is refused before the export is written
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(tmp_path / "x"), "--calibration", str(cal)])
    assert r.exit_code == 2 and "fitted for step(s)" in r.output and not (tmp_path / "x").exists()


def test_export_refuses_what_it_cannot_write(exported, tiny_run, tmp_path):
    r = runner.invoke(app, ["export", str(exported[0]), "-o", str(tmp_path / "again")])
    assert r.exit_code == 2 and "is an export already" in r.output
    r = runner.invoke(app, ["export", str(tmp_path), "-o", str(tmp_path / "m")])
    assert r.exit_code == 1 and "not a `pingctl train` run" in r.output
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(theirs)])
    assert r.exit_code == 2 and (theirs / "notes.txt").read_text() == "keep me"
    for inside in (tiny_run, tiny_run / "maxtext", tiny_run.parent):  # --force here could take the checkpoints
        r = runner.invoke(app, ["export", str(tiny_run), "-o", str(inside), "--force"])
        assert r.exit_code == 2 and "write the export outside it" in r.output, r.output
    assert (tiny_run / "config.yaml").is_file() and (tiny_run / "maxtext" / "checkpoints").is_dir()
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(tmp_path / "m"), "--step", "12345"])
    assert r.exit_code == 1 and "no checkpoint at step 12345" in r.output
