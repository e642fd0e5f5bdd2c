import json
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from pingctl.cli.app import app

runner = CliRunner()
HEAVY = ("jax", "maxtext", "grain", "pyarrow", "duckdb", "numpy", "orjson")


def _all_commands(typer_app: typer.Typer, prefix=()):
    group = typer.main.get_group(typer_app)

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            if path:  # a group below the root (config, bench) is a command too
                yield path
            for name, sub in subs.items():
                yield from walk(sub, path + (name,))
        else:
            yield path

    yield from walk(group, prefix)


def test_startup_imports_nothing_heavy():
    code = "import sys, pingctl.cli.app; print(','.join(m for m in %r if m in sys.modules))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_help_lists_every_command_with_a_summary():
    # Start-up speed itself is measured in docs/benchmarks.md; the import check above guards it.
    r = runner.invoke(app, ["--help"], terminal_width=200)
    for name in ("ingest", "synth", "shard", "inspect", "config", "bench"):
        line = next(line for line in r.output.splitlines() if f" {name} " in line)
        assert len(line.split(name, 1)[1].strip(" │")) > 10, line


@pytest.mark.parametrize("path", list(_all_commands(app)), ids=" ".join)
def test_every_command_help_has_an_example(path):
    r = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert r.exit_code == 0
    assert "Example:" in r.output, path


def _command(path):
    cmd = typer.main.get_group(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path", list(_all_commands(app)) + [()], ids=lambda p: " ".join(p) or "pingctl")
def test_every_bracket_of_a_help_text_prints(path):
    """Typer reads help as Rich markup, where "[default: eval.queries, 300]" or "[data]" is a
    style tag and vanishes ("measurements of each side ."): every bracketed note a help text
    holds (defaults, requirements, extras) prints as written."""
    cmd = _command(path)
    texts = [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]
    wanted = [" ".join(b.split()) for t in texts for b in re.findall(r"\[[^\[\]]*\]", t.replace("\\[", "["))]
    # wide enough that no word of a help column is cut short ("eval.context_polic…" at 80)
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    shown = " ".join(r.output.replace("│", " ").split())
    for b in wanted:
        # wrapped at a space inside the brackets, the note reads the same once spaces are joined
        assert b in shown, f"{' '.join(path)} --help lost {b}"


def test_help_says_which_commands_need_which_extra():
    """`pingctl --help` names each command that needs an extra with that extra, and each such
    command's own --help says it, from the table the commands' checks read."""
    from pingctl.errors import COMMAND_NEEDS

    shown = " ".join(runner.invoke(app, ["--help"], terminal_width=200).output.replace("│", " ").split())
    assert "[data]" in shown and "[train] holds everything" in shown
    for command, (extra, _) in COMMAND_NEEDS.items():
        listed = shown.split("need an extra:", 1)[1].split(f"[{extra}]", 1)[0]
        assert command.split(" --")[0] in listed.rsplit(";", 1)[-1], (command, extra, listed)
        name = command.split()[0]
        own = " ".join(runner.invoke(app, [name, "--help"], terminal_width=200).output.replace("│", " ").split())
        assert f"[{extra}]" in own, (command, own[-400:])


@pytest.mark.parametrize("args", [
    ["sample", "run", "--n", "0"],
    ["sample", "run", "--n", "2", "--measurements", "0"],
    ["sample", "run", "--src", "1.2.3.4", "--dst", "8.8.*.*", "-k", "-2"],
    ["eval", "run", "--train", "a", "--test", "b", "--queries", "0"],
    ["eval", "run", "--train", "a", "--test", "b", "--context", "-1"],
    ["inspect", "table.parquet", "-n", "-1"],
    ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", "--size", "70000"],
    ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", "--errors", "-1"],
    ["tokenize", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3", "--seed", "-1"],
    ["tokenize", "--scheme", "full", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3",
     "--msm-id", "99999999999999999999999"],
    ["bench", "loader", "--batches", "0"],
    ["bench", "train", "--steps", "0"],
    ["bench", "synth", "--rows", "0"],
], ids=" ".join)
def test_out_of_range_numbers_are_usage_errors(args):
    # Range checks sit in the option itself so they fail before any data or model is read:
    # a --n -3 once reached the sampler as a negative count and ended in an IndexError.
    r = runner.invoke(app, args, terminal_width=200)
    assert r.exit_code == 2 and "Invalid value" in r.output and "Traceback" not in r.output, r.output


def test_kv_table_folds_long_paths_instead_of_cutting_them():
    from rich.console import Console

    from pingctl.cli.common import kv_table

    path = "/work/main/runs/atlas/train/maxtext/tensorboard/pingctl-run-0123456789abcdef"
    con = Console(width=80, record=True, file=open("/dev/null", "w"))
    con.print(kv_table("train summary", [("TensorBoard", path), ("elapsed s", 191.0)]))
    text = con.export_text()
    assert "…" not in text
    assert path in "".join(text.split()).replace("│", "")
    assert "│ /work/main/" in text  # its pieces start at the left, so the fold reads as one path
    assert " 191.000 │" in text  # numbers stay right-aligned
    con.print(kv_table("modal", [("image", "debian_slim + pingctl[train] 0.1.0 + jax[cuda12]")]))
    assert "pingctl[train] 0.1.0 + jax[cuda12]" in con.export_text()  # values are text, not markup


def test_bench_table_keeps_every_figure_whole_at_80_columns(tmp_path, monkeypatch):
    from pingctl.cli import common

    monkeypatch.setattr(common.console, "width", 80)
    out = tmp_path / "b.json"
    r = runner.invoke(app, ["bench", "tokenize", "--n", "20000", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    rows = json.loads(out.read_text())["table"]
    for row in rows:
        for col in ("meas/s", "tokens/s"):
            if isinstance(row.get(col), (int, float)):
                assert common.fmt(row[col]) in r.output, (row["case"], col)


def test_decode_of_a_binary_file_is_a_clear_error(tmp_path):
    f = tmp_path / "ids.bin"
    f.write_bytes(b"\x00\xff\xfe" * 10)
    r = runner.invoke(app, ["tokenize", "--decode", f"@{f}"])
    assert r.exit_code == 1 and "not text" in r.output and "internal error" not in r.output


@pytest.mark.parametrize("args, message", [
    (["bench", "loader", "--workers", "a,b"], "comma-separated whole numbers"),
    (["bench", "loader", "--workers", "-3"], "at least 0"),
    (["bench", "loader", "--scheme", "bogus"], "compact or full"),
    (["bench", "ingest", "--workers", "0"], "at least 1"),
    (["bench", "shard", "--rows", "100", "--strategy", "time,bogus"], "'bogus' is not one of time, probe"),
    (["bench", "shard", "--rows", "100", "--memory-limit", "lots"], "a DuckDB memory limit is a size"),
    (["bench", "build-rows", "--rows", "100", "--memory-limit", "0"], "above 0"),
    (["bench", "tokenize", "--scheme", "bogus"], "compact, full or both"),
    (["bench", "synth", "--seed", "-1"], "Invalid value"),
    (["bench", "tokenize", "--n", "999"], "Invalid value"),
    (["bench", "sample", "no-run", "--context", "0,-2"], "at least 0"),
    (["bench", "sample", "no-run", "--step", "x"], "--step"),
])
def test_bench_options_are_usage_errors_before_any_work(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and message in r.output and "internal error" not in r.output


def test_bench_refuses_too_few_steps_or_batches_and_an_unusable_out(tmp_path):
    assert runner.invoke(app, ["bench", "train", "--steps", "1"]).exit_code == 2
    assert runner.invoke(app, ["bench", "loader", "--batches", "1"]).exit_code == 2
    r = runner.invoke(app, ["bench", "synth", "--rows", "1000", "--out", str(tmp_path)])
    assert r.exit_code == 1 and "a directory" in r.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, kind, code, message", [
    (["sample", "no-run", "--src", "1.2.3.4", "--rtt", "10-"], "usage", 2, "a range needs both ends"),
    (["sample", "no-run", "--n", "2"], "input", 1, "not a `pingctl train` run"),
    (["config", "show", "--set", "loader.seq_len=-5"], "config", 2, "loader.seq_len"),
    # user text in a message prints as given, not as Rich markup
    (["tokenize", "--src", "[bold]x", "--dst", "5.6.7.8", "--rtt", "3"], "usage", 2, "'[bold]x'"),
])
def test_a_failure_with_json_is_one_json_object_on_stdout(args, kind, code, message):
    r = runner.invoke(app, [*args, "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == code == err["exit_code"] and err["kind"] == kind and message in err["message"], r.output
    assert message in r.stderr
    plain = runner.invoke(app, args)  # without --json nothing reaches stdout
    assert plain.exit_code == code and plain.stdout == "" and message in plain.stderr


def test_interrupt_and_internal_errors_keep_their_exit_codes_and_json(capsys, monkeypatch):
    from pingctl.cli.common import handle_errors

    monkeypatch.delenv("PINGCTL_DEBUG", raising=False)

    def interrupted(as_json=False):
        raise KeyboardInterrupt

    def broken(as_json=False):
        raise ZeroDivisionError("boom")

    for fn, code, kind, text in ((interrupted, 130, "interrupted", "run the command again"),
                                 (broken, 70, "internal", "ZeroDivisionError: boom")):
        for as_json in (False, True):
            with pytest.raises(typer.Exit) as e:
                handle_errors(fn)(as_json=as_json)
            out = capsys.readouterr()
            assert e.value.exit_code == code and text in out.err
            if as_json:
                err = json.loads(out.out)["error"]
                assert (err["kind"], err["exit_code"]) == (kind, code) and text in err["message"]
            else:
                assert out.out == ""

    def train(as_json=False):
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit):
        handle_errors(train)()
    assert "resumes from the last one" in capsys.readouterr().err  # only train speaks of checkpoints


def test_ctrl_c_inside_a_duckdb_query_is_an_interrupt_not_an_internal_error(capsys):
    import os
    import signal
    import threading

    import duckdb

    from pingctl.cli.common import handle_errors

    def long_query(as_json=False):
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        duckdb.connect().sql("SELECT count(*) FROM range(10000000000) a").to_arrow_table()

    def interrupted_connection(as_json=False):
        con = duckdb.connect()
        threading.Timer(0.3, con.interrupt).start()
        con.execute("SELECT count(*) FROM range(10000000000) a").fetchall()

    for fn in (long_query, interrupted_connection):
        with pytest.raises(typer.Exit) as e:
            handle_errors(fn)(as_json=True)
        out = capsys.readouterr()
        assert e.value.exit_code == 130 and json.loads(out.out)["error"]["kind"] == "interrupted", out
        assert "internal error" not in out.err


def test_duckdb_out_of_memory_says_to_raise_the_memory_limit(tmp_path):
    import pyarrow.parquet as pq

    from tests.conftest import make_table

    pq.write_table(make_table(20_000), tmp_path / "t.parquet")
    r = runner.invoke(app, ["shard", str(tmp_path / "t.parquet"), "-o", str(tmp_path / "out"), "--memory-limit", "1KB"])
    text = " ".join(r.output.split())
    assert r.exit_code == 1 and "ran out of memory under its memory limit: raise it (--memory-limit" in text, r.output
    assert "internal error" not in text and "cannot read input Parquet" not in text


def test_ctrl_c_during_start_up_is_an_interrupt_not_an_import_traceback(monkeypatch, capsys):
    import pingctl.cli as cli

    class CtrlC:
        def find_spec(self, name, path=None, target=None):
            if name == "pingctl.cli.app":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "pingctl.cli.app")
    monkeypatch.setattr(sys, "meta_path", [CtrlC(), *sys.meta_path])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 130 and "interrupted before the command started" in capsys.readouterr().err


def test_the_console_script_is_the_interrupt_safe_entry_point():
    import tomllib
    from pathlib import Path

    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pingctl"] == "pingctl.cli:main"


def test_paths_in_notes_and_errors_print_as_given_not_as_markup(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    out = tmp_path / "o[red]x"
    r = runner.invoke(app, ["ingest", str(bad), "-o", str(out)])
    assert r.exit_code == 1 and "o[red]x/rejects.jsonl" in "".join(r.stderr.split()), r.stderr


def test_an_output_the_command_may_not_replace_is_a_usage_error(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (tmp_path / "afile").write_text("keep")
    for out, needle in (("mine", "did not write"), ("afile", "exists and is a file")):
        r = runner.invoke(app, ["synth", "--rows", "1000", "-o", str(tmp_path / out), "--json"])
        err = json.loads(r.stdout)["error"]
        assert r.exit_code == 2 and err["kind"] == "usage" and needle in err["message"], r.output
    assert (tmp_path / "mine" / "notes.txt").read_text() == (tmp_path / "afile").read_text() == "keep"


def _noisy_app():
    """A command that prints to stdout the way MaxText's import does ("[NO-OP] gcs_storage ...")."""
    from pingctl.cli.common import JsonOpt, emit, handle_errors
    from pingctl.errors import UsageError

    noisy = typer.Typer()

    @noisy.command()
    @handle_errors
    def go(fail: bool = False, as_json: JsonOpt = False) -> None:
        print("[NO-OP] gcs_storage dependency missing; using stubs.")
        if fail:
            raise UsageError("bad input in row 3")
        emit({"ok": 1}, as_json)

    return noisy


def test_json_stdout_is_one_document_even_when_a_library_prints():
    r = runner.invoke(_noisy_app(), ["--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"ok": 1}
    assert "gcs_storage" in r.stderr  # moved, not swallowed
    r = runner.invoke(_noisy_app(), ["--fail", "--json"])
    assert r.exit_code == 2 and json.loads(r.stdout)["error"]["message"] == "bad input in row 3"
    # without --json the print stays where it was: stdout is for people then
    r = runner.invoke(_noisy_app(), [])
    assert r.exit_code == 0 and "gcs_storage" in r.stdout


# Every size a user can type is bounded, and checked before any work: the value just past each
# bound is a usage error naming the option (sample's bounds: pingctl/infer/questions.py; eval,
# bench and tokenize: the constants blocks of their CLI modules). No run, no data: fast.
def _past_bounds():
    from pingctl.cli import bench_cmd as B, eval_cmd as E, tokenize_cmd as T
    from pingctl.infer import questions as QS

    fields = ["--src", "1.2.3.4", "--dst", "5.6.7.8", "--rtt", "3"]
    return [
        (["sample", "no-run", "--n", str(QS.MAX_STREAMS + 1)], "--n"),
        (["sample", "no-run", "--src", "1.2.3.4", "--n", str(QS.MAX_STREAMS + 1)], "--n"),
        (["sample", "no-run", "--n", "1", "--measurements", str(QS.MAX_MEASUREMENTS + 1)], "--measurements"),
        (["sample", "no-run", "--n", str(QS.MAX_GENERATED // QS.MAX_MEASUREMENTS + 1),
          "--measurements", str(QS.MAX_MEASUREMENTS)], "--measurements"),
        (["sample", "no-run", "--src", "1.2.3.4", "--rtt", "10-30", "--n", str(QS.MAX_SAMPLES + 1)], "--n"),
        (["sample", "no-run", "--src", "1.2.3.4", "--rtt", "10-30", "-k", str(QS.MAX_K + 1)], "-k"),
        (["sample", "no-run", "--src", "1.2.3.4", "--dst", "8.8.*.*", "-k", str(QS.COMPLETE_BEAM + 1)], "-k"),
        (["eval", "run", "--train", "a", "--test", "b", "--queries", str(E.MAX_QUERIES + 1)], "--queries"),
        (["eval", "run", "--train", "a", "--test", "b", "--context", str(E.MAX_CONTEXT + 1)], "--context"),
        (["eval", "run", "--train", "a", "--test", "b", "--set", f"eval.queries={E.MAX_QUERIES + 1}"],
         "eval.queries"),
        (["tokenize", "in.parquet", "-n", str(T.MAX_SHOW + 1)], "-n"),
        (["tokenize", "in.parquet", "--stats", "--max-rows", str(T.MAX_STATS_ROWS + 1)], "--max-rows"),
        (["tokenize", *fields, "-n", str(T.MAX_SHOW + 1)], "-n"),
        (["bench", "ingest", "--limit", str(B.MAX_SAGAN + 1)], "--limit"),
        (["bench", "ingest", "--workers", f"1,{B.MAX_WORKERS + 1}"], "--workers"),
        (["bench", "synth", "--rows", str(B.MAX_ROWS + 1)], "--rows"),
        (["bench", "shard", "--rows", str(B.MAX_ROWS + 1)], "--rows"),
        (["bench", "build-rows", "--rows", str(B.MAX_ROWS + 1)], "--rows"),
        (["bench", "tokenize", "--n", str(B.MAX_TOKENIZE + 1)], "--n"),
        (["bench", "loader", "--seq-len", str(B.MAX_SEQ_LEN + 1)], "--seq-len"),
        (["bench", "loader", "--batch-size", str(B.MAX_BATCH + 1)], "--batch-size"),
        (["bench", "loader", "--batches", str(B.MAX_BATCHES + 1)], "--batches"),
        (["bench", "loader", "--workers", f"0,{B.MAX_WORKERS + 1}"], "--workers"),
        (["bench", "train", "--steps", str(B.MAX_STEPS + 1)], "--steps"),
        (["bench", "train", "--seq-len", str(B.MAX_SEQ_LEN + 1)], "--seq-len"),
        (["bench", "train", "--batch-size", str(B.MAX_BATCH + 1)], "--batch-size"),
        (["bench", "sample", "no-run", "--queries", str(B.MAX_QUERIES + 1)], "--queries"),
        (["bench", "sample", "no-run", "--exact-queries", str(B.MAX_QUERIES + 1)], "--exact-queries"),
        (["bench", "sample", "no-run", "--streams", str(B.MAX_STREAMS + 1)], "--streams"),
        (["bench", "sample", "no-run", "--context", f"0,{B.MAX_CONTEXT + 1}"], "--context"),
    ]


@pytest.mark.parametrize("args, option", _past_bounds(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_size_just_past_its_bound_is_a_usage_error_naming_the_option(args, option):
    r = runner.invoke(app, args, terminal_width=200)
    assert r.exit_code == 2 and option in r.output and "Traceback" not in r.output, r.output
    assert any(w in r.output for w in ("bound", "at most", "less than or equal", "<=")), r.output


@pytest.mark.parametrize("args", [[], ["--src", "1.2.3.4", "--rtt", "10-30"]], ids=["generation", "inverse"])
def test_a_trillion_samples_is_refused_at_once(args):
    # it once grew to 22 GB until killed (generation), or asked NumPy for 7.28 TiB (inverse search)
    import time

    t0 = time.perf_counter()
    r = runner.invoke(app, ["sample", "no-run", *args, "--n", "1000000000000", "--json"])
    assert r.exit_code == 2 and time.perf_counter() - t0 < 10, r.output
    err = json.loads(r.stdout)["error"]
    assert err["kind"] == "usage" and "--n 1,000,000,000,000 is beyond the bound of" in err["message"]
