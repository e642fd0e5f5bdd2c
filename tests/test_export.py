"""`pingctl export`: a model directory that answers as its run did, without the run."""

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

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
    # run_config reads an export through the config it embeds: what check_run and sample see, the
    # run's own paths named by their last two parts (an export is shared)
    run_cfg = run_config(tiny_run)
    shared = {k: EX.shown_path(getattr(run_cfg.train, k)) for k in ("run_dir", "train_rows")}
    assert run_config(out) == run_cfg.model_copy(update={"train": run_cfg.train.model_copy(update=shared)})
    assert config["source"]["run"] == EX.shown_path(tiny_run) == "synthrows/tiny-run"
    card = (out / "README.md").read_text()
    assert "preset `tiny`" in card and "| step | train loss" in card and f"step {latest}" in card
    assert_shareable(out, tiny_run)


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
    assert d["source_run"] == "synthrows/tiny-run" and d["tensor_dtypes"] == {"F32": summary["tensors"]}
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
    from pingctl.infer.engines.maxtext.weights import assign

    out = exported[0]
    tensors = dict(EX.read_tensors(out))
    first = min(tensors)
    ask = ["--src", pair[0], "--dst", pair[1]]

    def reshape(t):
        t[first] = np.zeros((*t[first].shape, 2), t[first].dtype)

    bad = _rewrite(out, tmp_path / "shape", reshape)
    r = runner.invoke(app, ["sample", str(bad), *ask])
    assert r.exit_code == 1 and f"tensor {first} has shape" in r.output and "Traceback" not in r.output, r.output
    # every other mismatch is found by the same check, before any weight is replaced (the
    # engine's: the light engine's names-shapes-dtypes check, or MaxText's assign)
    from pingctl.infer.engines.arch import check_weights

    m = models[1]
    state, before = m.net.state, m.weights()
    for change, why in ((lambda t: t.update({first: t[first].astype(np.float16)}), f"tensor {first} is float16"),
                        (lambda t: t.pop(first), f"tensor {first} is missing"),
                        (lambda t: t.update({"decoder.extra.kernel": t[first]}), "tensor decoder.extra.kernel is not")):
        changed = dict(tensors)
        change(changed)
        with pytest.raises(PingctlError, match=why):
            if m.engine == "maxtext":
                assign(state, changed, out / EX.WEIGHTS)
            else:
                check_weights(m.net.arch, changed, out / EX.WEIGHTS)
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
    assert shipped.meta["run"] == "synthrows/tiny-run"  # the export names its run by its last two parts
    CAL.check_fits(shipped, out, EX.source_steps(EX.read_config(out)))
    with pytest.raises(UsageError, match="fitted for step"):
        CAL.check_fits(shipped, out, steps[-1:])
    # the map as `pingctl eval` wrote it (the run's absolute path) fits the export too; another run's not
    CAL.check_fits(CAL.load(cal), out, steps)
    other = CAL.Calibration(shipped.knots, {**shipped.meta, "run": "/elsewhere/runs/other"})
    with pytest.raises(UsageError, match="was fitted for run /elsewhere/runs/other"):
        CAL.check_fits(other, out, steps)
    assert_shareable(out, tiny_run, tmp_path)
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


def _damaged_copy(src, dst, change):
    """A copy of export `src` at `dst` whose config.json went through `change(dict)`."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    change(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


DAMAGED_CONFIGS = [
    # (change, what the message names)
    (lambda c: c["source"].update(steps="abc"), "field source.steps"),
    (lambda c: c["architecture"].pop("maxtext"), "field architecture.maxtext is missing"),
    (lambda c: c["architecture"]["maxtext"].update(base_emb_dim="64"), "field architecture.maxtext.base_emb_dim"),
    (lambda c: c["architecture"]["maxtext"].update(base_num_decoder_layers=0),
     "field architecture.maxtext.base_num_decoder_layers"),
    (lambda c: c["loader"].update(result_last=1.5), "field loader.result_last"),
    (lambda c: c["loader"].update(timestamps="yes"), "field loader.timestamps"),
    (lambda c: c["loader"].update(mode_weights=[1, 0]), "field loader.mode_weights"),
    (lambda c: c["vocab"].update(size=12), "vocab.size 12 differs from architecture.maxtext.vocab_size"),
    (lambda c: c["weights"].update(file="other.bin"), "field weights.file"),
    (lambda c: c.update(hidden_size=4096), "hidden_size 4096 differs from architecture.maxtext.base_emb_dim"),
    # copies of keys the run's maxtext.yml leaves to MaxText's base.yml, and of mlp_activations
    (lambda c: c.update(rms_norm_eps=0.1),
     "rms_norm_eps 0.1 differs from architecture.maxtext.normalization_layer_epsilon (not stated: MaxText's default)"),
    (lambda c: c.update(rope_theta=500000), "rope_theta 500000 differs from architecture.maxtext.rope_max_timescale"),
    (lambda c: c.update(hidden_act="relu"), "hidden_act 'relu' differs from architecture.maxtext.mlp_activations"),
]


@pytest.mark.parametrize("case", range(len(DAMAGED_CONFIGS)))
def test_a_damaged_config_json_is_named_field_by_field(exported, tmp_path, case):
    """Every field's type and range is checked as config.json is read: exit 1 naming the field,
    where a wrong type was once iterated as characters or a missing section a KeyError (exit 70)."""
    change, needle = DAMAGED_CONFIGS[case]
    bad = _damaged_copy(exported[0], tmp_path / "bad", change)
    r = runner.invoke(app, ["inspect", str(bad), "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 1 and err["kind"] == "input", r.output
    assert "config.json: a damaged export" in err["message"] and needle in err["message"], err["message"]


@pytest.mark.parametrize("key, value", [("rms_norm_eps", 0.1), ("rope_theta", 500000), ("hidden_act", "relu")])
def test_an_edited_hugging_face_key_fails_a_sample_process(exported, tmp_path, pair, key, value):
    """rms_norm_eps, rope_theta and hidden_act describe the network as the others do; edited alone
    they once loaded with exit 0 (only keys the run's maxtext.yml states were compared, and
    hidden_act never): now a `pingctl sample` process exits 1 naming the file and the key."""
    bad = _damaged_copy(exported[0], tmp_path / "bad", lambda c: c.update({key: value}))
    proc = subprocess.run([sys.executable, "-m", "pingctl", "sample", str(bad), "--src", pair[0], "--dst", pair[1]],
                          capture_output=True, text=True, timeout=600)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{bad / 'config.json'}: a damaged export ({key} " in err, err


def test_the_maxtext_defaults_an_export_is_checked_with_are_maxtexts():
    """A key a run's maxtext.yml leaves out has MaxText's base.yml value: the Hugging Face copies
    are written and checked against EX.MAXTEXT_DEFAULTS, which must be that file's."""
    import importlib.util

    import yaml

    from pingctl.artifacts import export as EX

    spec = importlib.util.find_spec("maxtext")
    if spec is None:
        pytest.skip("MaxText is not installed")
    base = next(Path(d) / "configs" / "base.yml" for d in spec.submodule_search_locations
                if (Path(d) / "configs" / "base.yml").is_file())
    doc = yaml.safe_load(base.read_text())
    assert {k: doc[k] for k in EX.MAXTEXT_DEFAULTS} == EX.MAXTEXT_DEFAULTS


def test_a_damaged_config_fails_sample_and_model_load_as_input_errors(exported, tmp_path, pair):
    from pingctl import Model

    steps = _damaged_copy(exported[0], tmp_path / "steps", lambda c: c["source"].update(steps="abc"))
    r = runner.invoke(app, ["sample", str(steps), "--src", pair[0], "--dst", pair[1]])
    assert r.exit_code == 1 and "field source.steps" in r.output and "internal error" not in r.output, r.output
    net = _damaged_copy(exported[0], tmp_path / "net", lambda c: c["architecture"].pop("maxtext"))
    with pytest.raises(PingctlError, match="field architecture.maxtext is missing"):
        Model.load(net)


def test_non_finite_weights_are_refused_naming_the_tensor(exported, tmp_path, pair):
    """NaN weights once answered exit 0 with quantiles 0.0 and a bare NaN p_fail."""
    from pingctl import Model
    from pingctl.artifacts import export as EX

    out = exported[0]
    name = sorted(EX.read_tensors(out))[-1]

    def poison(t):
        a = t[name].copy()
        a.flat[0] = np.nan
        t[name] = a

    bad = _rewrite(out, tmp_path / "nan", poison)
    r = runner.invoke(app, ["sample", str(bad), "--src", pair[0], "--dst", pair[1], "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 1 and f"tensor {name} holds 1 non-finite value" in err["message"], r.output
    with pytest.raises(PingctlError, match=f"tensor {name} holds"):
        Model.load(bad)


def test_read_tensors_checks_every_float_dtype(tmp_path):
    import ml_dtypes
    from safetensors.numpy import save_file

    from pingctl.artifacts import export as EX

    finite = {"a.kernel": np.ones((2, 3), ml_dtypes.bfloat16), "b.count": np.arange(4, dtype=np.int32)}
    save_file(finite, str(tmp_path / EX.WEIGHTS))
    assert sorted(EX.read_tensors(tmp_path)) == ["a.kernel", "b.count"]
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        t = dict(finite, **{"c.scale": np.array([1, np.inf, -np.inf], dtype)})
        save_file(t, str(tmp_path / EX.WEIGHTS))
        with pytest.raises(PingctlError, match="tensor c.scale holds 2 non-finite values"):
            EX.read_tensors(tmp_path)


def test_the_safetensors_file_has_the_same_bytes_every_time(tmp_path):
    """safetensors writes its metadata in a hash map's order, which changes between writes."""
    from pingctl.artifacts import export as EX

    tensors = {f"layer{i}.kernel": np.full((3, 2), i, np.float32) for i in range(4)}
    written = set()
    for i in range(12):
        EX.write(tmp_path / f"m{i}", {"format": EX.FORMAT}, tensors, "card")
        written.add((tmp_path / f"m{i}" / EX.WEIGHTS).read_bytes())
    assert len(written) == 1
    assert sorted(EX.read_tensors(tmp_path / "m0")) == sorted(tensors)


@pytest.mark.slow
def test_exporting_the_same_run_again_writes_the_same_bytes(tiny_run, exported, tmp_path):
    again = tmp_path / "again"
    r = runner.invoke(app, ["export", str(tiny_run), "-o", str(again)])
    assert r.exit_code == 0, r.output
    first = exported[0]
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in first.iterdir())
    for f in first.iterdir():  # `created` included: when the checkpoint was committed, not when exported
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name


_ABSOLUTE = __import__("re").compile(r"(?:^|[\s`'\"(=:])/[A-Za-z0-9_.-]+/")


def assert_shareable(export: Path, *paths) -> None:
    """No file of `export` (nor a member of its .npz files) holds the exporting machine's paths:
    `paths`, its temporary directory, its home, the working directory; nor, in its text files,
    any absolute path."""
    where = {str(p) for p in paths} | {tempfile.gettempdir() + "/", str(Path.home()) + "/", str(Path.cwd())}
    for f in sorted(export.iterdir()):
        blobs = [f.read_bytes()]
        if f.suffix == ".npz":
            with zipfile.ZipFile(f) as z:
                blobs += [z.read(n) for n in z.namelist()]
        for blob in blobs:
            for p in where:
                assert p.encode() not in blob, f"{f.name} holds {p}"
        if f.suffix in (".json", ".md"):
            hit = _ABSOLUTE.search(f.read_text())
            assert hit is None, f"{f.name}: {hit and f.read_text()[max(0, hit.start() - 60):hit.end() + 20]}"


def _front_matter(card: str) -> tuple[dict, str]:
    import yaml

    assert card.startswith("---\n"), card[:100]
    head, _, body = card[4:].partition("\n---\n")
    return yaml.safe_load(head), body


def test_config_json_reads_as_a_hugging_face_config(exported):
    from pingctl.artifacts import export as EX

    out = exported[0]
    config = EX.read_config(out)
    net = config["architecture"]["maxtext"]
    assert config["model_type"] == "pingctl" and config["architectures"] == ["PingctlForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"], config["vocab_size"],
            config["max_position_embeddings"], config["torch_dtype"]) == (
        net["base_emb_dim"], net["base_num_decoder_layers"], net["base_num_query_heads"], net["base_num_kv_heads"],
        net["head_dim"], net["base_mlp_dim"], net["vocab_size"], net["max_target_length"], net["weight_dtype"])
    assert config["hidden_act"] in net["mlp_activations"] and config["rms_norm_eps"] > 0 and config["rope_theta"] > 0
    transformers = pytest.importorskip("transformers")
    hf = transformers.PretrainedConfig.from_pretrained(str(out))
    assert hf.model_type == "pingctl" and hf.hidden_size == net["base_emb_dim"]
    assert hf.architectures == ["PingctlForCausalLM"]
    assert hf.num_hidden_layers == net["base_num_decoder_layers"]


def test_the_model_card_has_front_matter_and_no_absolute_path(exported, tiny_run):
    out = exported[0]
    card = (out / "README.md").read_text()
    meta, body = _front_matter(card)
    assert meta["library_name"] == "pingctl" and meta["license"] and "pingctl" in meta["tags"]
    assert meta["pipeline_tag"] == "time-series-forecasting"
    # the rows' manifest leads back to `pingctl synth`'s output (a tree renamed whole still does)
    assert meta["datasets"] == ["pingctl-synth"]
    data = meta["pingctl"]["training_data"]
    assert data["rows"] == "synthrows/rows" and data["measurements"] > 0 and data["probes"] == 24
    assert "synthetic ping measurements" in data["description"] and meta["pingctl"]["run"] == "synthrows/tiny-run"
    assert "metrics" not in meta and "model-index" not in meta  # no eval report beside the run
    assert body.lstrip().startswith("# pingctl-tiny-synthrows-tiny-run: a pingctl model")
    # how to install pingctl (not on PyPI) and load this model, and the data's terms
    assert "pip install './dist/pingctl-0.1.0-py3-none-any.whl[hub]'" in body and "not on PyPI" in body
    assert 'model = Model.load("THIS_DIR")' in body and "from pingctl import Model" in body
    assert "The measurements are synthetic" in body
    assert str(tiny_run) not in card and str(tiny_run.parent) not in card
    assert not _ABSOLUTE.search(card), _ABSOLUTE.search(card)
    from huggingface_hub import ModelCard

    assert ModelCard.load(out / "README.md").data.library_name == "pingctl"


def test_the_model_card_quotes_the_eval_headline(exported, tiny_run):
    from pingctl.artifacts import export as EX
    from pingctl.artifacts.run import run_config
    from pingctl.infer.export import model_card

    report = {"queries": 48, "inputs": {"run": str(tiny_run), "test": str(tiny_run.parent / "splits" / "test")},
              "rows": [{"predictor": "model", "median_rel_err": 0.125, "p90_rel_err": 0.5, "mae_ms": 3.25,
                        "cov50": 0.5, "cov90": float("nan")},
                       {"predictor": "pair median", "median_rel_err": 0.2}]}
    config = EX.read_config(exported[0])
    card = model_card(tiny_run, dict(config, eval_report=str(tiny_run.parent / "eval" / "report.json")),
                      run_config(tiny_run), report)
    meta, body = _front_matter(card)
    assert meta["metrics"] == ["median_relative_error", "p90_relative_error", "mae_ms", "coverage_50"]
    entry = meta["model-index"][0]
    result = entry["results"][0]
    assert {m["type"]: m["value"] for m in result["metrics"]} == {
        "median_relative_error": 0.125, "p90_relative_error": 0.5, "mae_ms": 3.25, "coverage_50": 0.5}
    # named by what it is, and its dataset by where the measurements came from and which split
    assert entry["name"] == "pingctl-tiny-synthrows-tiny-run" and result["task"]["type"] == meta["pipeline_tag"]
    assert result["dataset"] == {"name": "synthetic ping measurements (pingctl synth), held-out split `splits/test`",
                                 "type": "pingctl-synth", "split": "test"}
    assert result["dataset"]["type"] in meta["datasets"] and "From `eval/report.json`" in body
    assert not _ABSOLUTE.search(card), _ABSOLUTE.search(card)
    pushed = model_card(tiny_run, config, run_config(tiny_run), report, "acme/pingctl-tiny")
    meta, body = _front_matter(pushed)
    assert meta["model-index"][0]["name"] == "acme/pingctl-tiny" and 'Model.load("acme/pingctl-tiny")' in body
    assert "pingctl sample acme/pingctl-tiny --src" in body
    # what the Hub checks of a card before a push (as the stand-in of tests/test_hub.py does)
    from tests.hub_standin import card_errors

    assert card_errors(card) == [] and card_errors(pushed) == []


def _ripe_chain(root: Path) -> Path:
    """Manifests as ingest, shard and build-rows leave them (the keys data_origin follows):
    RIPE Atlas results -> a table -> a time split -> rows of its train split. Returns the rows."""
    def manifest(d: Path, doc: dict) -> None:
        d.mkdir(parents=True, exist_ok=True)
        (d / "manifest.json").write_text(json.dumps(doc))

    manifest(root / "ingest", {"kind": "pingctl-ingest", "inputs": [{"path": str(root / "raw" / "1001.jsonl.bz2")}]})
    manifest(root / "splits", {"command": "shard", "out": str(root / "splits"),
                               "inputs": [{"path": str(root / "ingest" / "part-00000.parquet")}]})
    manifest(root / "rows", {"command": "build-rows", "out": str(root / "rows"),
                             "sources": [{"path": str(root / "splits" / "train" / "part-00000.parquet")}]})
    return root / "rows"


def test_a_ripe_atlas_models_card_names_the_data_and_its_terms(exported, tiny_run, tmp_path):
    from pingctl.artifacts import export as EX
    from pingctl.artifacts.run import run_config
    from pingctl.infer.export import data_origin, model_card

    rows = _ripe_chain(tmp_path / "ripe")
    assert data_origin(rows) == "ripe-atlas" and data_origin(rows.parent / "splits" / "train") == "ripe-atlas"
    moved = tmp_path / "moved"
    (tmp_path / "ripe").rename(moved)  # recorded paths no longer exist: read relative to each manifest
    assert data_origin(moved / "rows") == "ripe-atlas"
    assert data_origin(tmp_path / "nothing") is None
    cfg = run_config(tiny_run)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"train_rows": str(moved / "rows")})})
    meta, body = _front_matter(model_card(tiny_run, EX.read_config(exported[0]), cfg, None))
    assert meta["datasets"] == ["ripe-atlas"] and "RIPE Atlas ping measurements" in body
    assert "RIPE Atlas Service Terms and Conditions](https://atlas.ripe.net/legal/anchors/terms-conditions/)" in body


def _hub_cache(export, cache, repo: str):
    """A Hugging Face Hub cache holding `repo` (main) as snapshot_download leaves it: what a
    download of a pushed export looks like (the Hub itself is out of reach here)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(export, root / "snapshots" / commit)
    return root / "snapshots" / commit


def test_a_hub_repo_id_resolves_through_the_cache(exported, tmp_path, monkeypatch):
    from pingctl.artifacts.hub import resolve_model_path

    snapshot = _hub_cache(exported[0], tmp_path / "hub", "acme/tiny-rtt")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path("acme/tiny-rtt") == snapshot
    assert resolve_model_path(str(exported[0])) == exported[0]  # a directory is itself
    with pytest.raises(PingctlError, match="acme/nothing: no such directory.*HF_HUB_OFFLINE"):
        resolve_model_path("acme/nothing")
    (tmp_path / "hub" / "models--acme--empty" / "refs").mkdir(parents=True)
    (tmp_path / "hub" / "models--acme--empty" / "refs" / "main").write_text("f" * 40)
    (tmp_path / "hub" / "models--acme--empty" / "snapshots" / ("f" * 40)).mkdir(parents=True)
    with pytest.raises(PingctlError, match="holds no `pingctl export` model"):
        resolve_model_path("acme/empty")


@pytest.mark.slow
def test_model_load_takes_a_hub_repo_id(exported, tmp_path, monkeypatch, pair):
    from pingctl import Model

    snapshot = _hub_cache(exported[0], tmp_path / "hub", "acme/tiny-rtt")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from_hub, from_dir = Model.load("acme/tiny-rtt"), Model.load(exported[0])
    assert from_hub.run == snapshot.resolve() or from_hub.run == snapshot
    assert from_hub.steps == from_dir.steps
    a, b = from_hub.rtt(*pair), from_dir.rtt(*pair)
    assert a.p_fail == b.p_fail and a.quantiles == b.quantiles
