import json

import pytest
import yaml
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.config import Config, commented_yaml, load_config
from pingctl.errors import ConfigError

runner = CliRunner()


def test_defaults_roundtrip_through_commented_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(commented_yaml())
    assert load_config(path) == Config()
    # every key is documented by a comment line just above it
    lines = commented_yaml().splitlines()
    for i, line in enumerate(lines):
        if ":" in line and not line.strip().startswith("#") and not line.rstrip().endswith(":"):
            assert lines[i - 1].strip().startswith("#"), line


def test_precedence_yaml_then_set_then_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"data": {"synth": {"rows": 10, "seed": 5}}}))
    cfg = load_config(path, ["data.synth.rows=20", "loader.mode_weights=[1, 0, 0]"], {"data.synth.seed": 9})
    assert cfg.data.synth.rows == 20
    assert cfg.data.synth.seed == 9
    assert cfg.loader.mode_weights == (1.0, 0.0, 0.0)
    # None from the CLI means "not given": the file wins
    assert load_config(path, [], {"data.synth.seed": None}).data.synth.seed == 5


@pytest.mark.parametrize(
    "override, needle",
    [
        ("data.shard.strategy=bogus", "data.shard.strategy = 'bogus'"),
        ("data.synth.rows=-3", "greater than 0"),
        ("data.synt.rows=3", "did you mean data.synth"),
        ("data.ingest.sample=2", "less than or equal to 1"),
        ("noequals", "must look like"),
    ],
)
def test_invalid_values_name_field_value_and_allowed(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  synth:\n    rows: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*line"):
        load_config(path)


def test_cli_config_init_show_check(tmp_path):
    path = tmp_path / "p.yaml"
    r = runner.invoke(app, ["config", "init", str(path)])
    assert r.exit_code == 0 and path.exists()
    assert runner.invoke(app, ["config", "init", str(path)]).exit_code == 1  # no silent overwrite
    r = runner.invoke(app, ["config", "init", str(path), "--force", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == {"path": str(path), "bytes": path.stat().st_size}
    r = runner.invoke(app, ["config", "show", "-c", str(path), "--set", "data.shard.strategy=probe", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["data"]["shard"]["strategy"] == "probe"
    r = runner.invoke(app, ["config", "check", "--set", "train.steps=0"])
    assert r.exit_code == 2
    assert "train.steps" in r.output and "Traceback" not in r.output


def test_docs_show_the_current_defaults():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    assert commented_yaml() in doc, "docs/config.md is stale: run `python scripts/update_config_doc.py`"


def test_non_utf8_config_and_non_finite_values_are_config_errors(tmp_path):
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    f = tmp_path / "bin.yaml"
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(f)
    for key in ("rows.max_row_mb", "sample.temperature", "data.synth.dual_stack_share"):
        for bad in ("inf", "nan"):
            with pytest.raises(ConfigError, match="finite"):
                load_config(None, [f"{key}=.{bad}"])


@pytest.mark.parametrize("override, needle", [
    ("data.ingest.since=garbage", "expected ISO 8601"),
    ("data.ingest.since=2024-13-01", "data.ingest.since = '2024-13-01': expected ISO 8601"),  # YAML's date: exit 70
    ("data.synth.start=2024-02-30", "not an ISO 8601 time"),
    ("data.ingest.until=nan", "not a valid time"),
    ("data.shard.memory_limit=banana", "memory limit is a size"),
    ("rows.memory_limit=4 parsecs", "memory limit is a size"),
    ("data.synth.start=garbage", "not an ISO 8601 time"),
    ("rows.memory_limit=4096", "needs a unit: 4096MB"),  # was "Input should be a valid string"
    ("eval.seed=true", "a boolean"),  # pydantic made it seed 1
    ("data.synth.rows=on", "a boolean"),  # YAML 1.1: on = true
    ("eval.context=yes", "a boolean"),
    # Grain raised NotImplementedError at a run's first batch
    ("loader.visualize_dir=/tmp/graph", "cannot write the pipeline graph to a file; set loader.visualize=true"),
])
def test_check_catches_what_a_run_would_refuse(override, needle):
    # `config check` said "valid" for these; the run then failed on them
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        load_config(None, [override])


def test_memory_limits_and_times_that_are_fine():
    from pingctl.config import load_config

    cfg = load_config(None, ["data.shard.memory_limit=512 MiB", "rows.memory_limit=4gb",
                             "data.ingest.since=2024-01-01", "data.ingest.until=1800000000",
                             "data.synth.start=2024-02-01T00:00:00"])
    assert cfg.rows.memory_limit == "4gb" and cfg.data.ingest.until == "1800000000"
    cfg = load_config(None, ["train.wandb=yes", "data.ingest.drop_dups=true"])  # booleans where they belong
    assert cfg.train.wandb is True and cfg.data.ingest.drop_dups is True


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    f = tmp_path / "dup.yaml"
    f.write_text("rows:\n  max_row_mb: 4\n  max_row_mb: 8\n")
    with pytest.raises(ConfigError, match="line 3.*'max_row_mb' is given twice"):
        load_config(f)
    f.write_text("rows:\n  max_row_mb: 4\nloader:\n  seq_len: 512\n")
    assert load_config(f).rows.max_row_mb == 4


@pytest.mark.parametrize("text", ["? [a, b]\n: 1\n", "? {a: 1}\n: 1\n", "loader:\n  ? [a]\n  : 1\n"])
def test_a_list_or_mapping_as_a_key_is_a_config_error(tmp_path, text):
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    f = tmp_path / "k.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match="a key must be a name"):
        load_config(f)


def test_a_number_as_a_key_and_a_directory_as_the_config_are_named(tmp_path):
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    f = tmp_path / "k.yaml"
    f.write_text("train:\n  1: 3\n")
    with pytest.raises(ConfigError, match=r"train\.1: a key must be a name, not the int 1"):
        load_config(f)
    with pytest.raises(ConfigError, match="is a directory; --config takes a YAML file"):
        load_config(tmp_path)


@pytest.mark.parametrize("args, needle", [
    (["shard", "in", "-o", "out", "--val", "0.6", "--test", "0.5"], "val_fraction + test_fraction must be < 1"),
    (["shard", "in", "-o", "out", "--memory-limit", "0"], "above 0"),
    (["build-rows", "in", "-o", "out", "--memory-limit", "0KB"], "above 0"),
    (["synth", "-o", "out", "--start", "1990-01-01"], "must lie between 2000-01-01 and now"),
    (["config", "check", "--set", "data.shard.val_fraction=0.7", "--set", "data.shard.test_fraction=0.3"],
     "data.shard: val_fraction + test_fraction must be < 1"),
])
def test_settings_that_cannot_work_are_config_errors_before_any_input_is_read(args, needle, tmp_path):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    r = CliRunner().invoke(app, [str(tmp_path / a) if a in ("in", "out") else a for a in args])
    assert r.exit_code == 2 and needle in r.output and "Value error" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_an_impossible_date_in_a_config_file_names_its_field(tmp_path):
    from pingctl.config import load_config
    from pingctl.errors import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text("data:\n  ingest:\n    since: 2024-13-01\n")  # PyYAML's own date: a bare ValueError
    with pytest.raises(ConfigError, match="data.ingest.since = '2024-13-01'"):
        load_config(f)
    f.write_text("data:\n  ingest:\n    since: 2024-01-01\n    until: 2024-02-01 00:00:00\n")
    assert load_config(f).data.ingest.since == "2024-01-01"
