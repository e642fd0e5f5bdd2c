"""`pingctl score -o DIR`: a table of any size scored a bucket of probes at a time, resumable
(pingctl/infer/score_parts.py, docs/score.md "A table of any size").

The driver's tests run on a stand-in model whose log-probabilities are a fixed function of a
sequence's tokens (no training, default tier); the tests at the end score with the session's
trained tiny model (slow tier): to the bit the whole table's scores, and the command itself."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.artifacts import score_output as SO
from pingctl.cli.app import app
from pingctl.errors import UsageError
from pingctl.infer import score as S
from pingctl.infer import score_parts as SP
from tests.conftest import make_table

runner = CliRunner()
VOCAB = 267
BAD = (3, 7)  # rows of the first file that build-rows rejects


class StandIn:
    """A model whose next-token log-probabilities at a position are a fixed function of the
    tokens up to it: what `score_rows` reads of a model, without training one. `passes` counts
    the forward passes asked for."""

    scheme, step, steps, timestamps, seq_len, max_per_pair = "compact", 1, (1,), True, 256, 0

    def __init__(self, run: Path):
        self.run = run
        self.passes = 0

    def log_probs(self, sequences, at=None):
        self.passes += 1
        out = []
        for k, s in enumerate(sequences):
            s = np.asarray(s, np.int64)
            pos = np.arange(len(s)) if at is None else np.asarray(at[k], np.int64)
            prefix = np.cumsum((s * 7919) % 1009)[pos]
            logits = 3.0 * np.sin(np.outer(prefix % 997 + s[pos], np.arange(VOCAB)) * 1e-3)
            out.append(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))
        return out

    def second_byte_log_probs(self, firsts, candidates):
        from pingctl.infer.queries import BYTE0

        return [np.stack([self.log_probs([np.append(f, BYTE0 + int(b))], at=[[len(f)]])[0][0] for b in c])
                if len(c) else np.zeros((0, VOCAB)) for f, c in zip(firsts, candidates)]


@pytest.fixture
def run(tmp_path) -> Path:
    """A model directory's config (what the prompt rules read), without weights."""
    from pingctl.artifacts.run import CONFIG, MAXTEXT_YML, write_config
    from pingctl.config import Config

    d = tmp_path / "run"
    d.mkdir()
    write_config(d / CONFIG, Config())
    (d / MAXTEXT_YML).write_text("run_name: run\n")
    return d


@pytest.fixture
def table(tmp_path) -> Path:
    """Two files: 400 rows of 12 probes with two bad rows, and 200 rows without prb_id (their
    probes are their source addresses, some the same addresses as the first file's probes)."""
    d = tmp_path / "table"
    d.mkdir()
    a = make_table(400, probes=12, targets=4, seed=1).to_pylist()
    a[BAD[0]]["rtt"], a[BAD[1]]["src_addr"] = 1e300, "not-an-address"
    pq.write_table(pa.Table.from_pylist(a, schema=make_table(1).schema), d / "a.parquet")
    pq.write_table(make_table(200, probes=6, targets=3, seed=2, prb=False), d / "b.parquet")
    return d


def _parts(out: Path):
    t = pa.concat_tables([pq.read_table(f) for f in SO.part_files(out)])
    return t.take(np.argsort(t.column("row").to_numpy()))


def _same_columns(got, want) -> None:
    """Every column of `want` in `got`, float columns to the bit (NaN included)."""
    for name in want.column_names:
        a, b = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        if pa.types.is_floating(b.type):
            assert a.type == b.type and np.array_equal(a.to_numpy().view(np.uint64), b.to_numpy().view(np.uint64)), name
        else:
            assert a.equals(b), name


def test_buckets_hold_whole_probes_and_every_valid_row_once(table, tmp_path):
    part = SP.partition(table, tmp_path / "out", bucket_rows=150)
    assert len(part.plan["buckets"]) >= 3
    assert part.rows_read == 600 == part.rows_valid + part.rows_rejected and part.rows_rejected == 2
    assert set(part.rejected) == {"bad_rtt", "bad_src_addr"}
    assert [part.rejected[r]["first"]["row"] for r in ("bad_rtt", "bad_src_addr")] == list(BAD)
    seen, rows = {}, []
    for i, b in enumerate(part.plan["buckets"]):
        t = pq.read_table(part.staging / b["file"])
        assert t.num_rows == b["rows"] > 0
        rows += t.column("row").to_pylist()
        for prb, src in zip(t.column("prb_id").to_pylist(), t.column("src_addr").to_pylist()):
            assert seen.setdefault(prb if prb is not None else src, i) == i  # a probe in one bucket only
    assert sorted(rows) == sorted(set(range(600)) - set(BAD))  # the place of each valid row among all read
    assert len(seen) == 12 + 6
    # the staging is reused as it is by a rerun of the same table
    assert SP.partition(table, tmp_path / "out", bucket_rows=150).plan == part.plan


@pytest.mark.parametrize("policy", ["stream", "probe"])
def test_bucketed_scores_are_the_whole_tables_row_by_row(table, run, tmp_path, policy):
    model = StandIn(run)
    whole = S.score_table(model, table, context=8, context_policy=policy)
    out = tmp_path / "out"
    manifest = SP.score_parts(model, SP.partition(table, out, bucket_rows=150), context=8, context_policy=policy)
    got = _parts(out)
    assert manifest["parts"] == len(manifest["data_files"]) >= 3
    assert got.column_names == [*whole.column_names, "row"]
    assert got.column("row").to_pylist() == sorted(set(range(600)) - set(BAD))
    _same_columns(got, whole)
    meta = S.score_meta(whole)
    for k in ("rows_read", "rows_scored", "rows_rejected", "rejected", "context_policy", "context", "context_per_pair"):
        assert manifest[k] == meta[k], k
    assert manifest["rows_read"] == manifest["rows_scored"] + manifest["rows_rejected"] == 600
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", *manifest["data_files"]]  # staging gone
    want, have = S.summary(whole, threshold=0.3), SP.summary(out, threshold=0.3)
    assert have.pop("nll_mean") == pytest.approx(want.pop("nll_mean"), rel=1e-12)
    assert have.pop("context_measurements_mean") == pytest.approx(want.pop("context_measurements_mean"), rel=1e-12)
    assert have == want and want["flagged"] > 10  # the median exact, the most surprising rows the same


def test_the_median_of_the_parts_is_numpys_whatever_the_values(tmp_path, monkeypatch):
    """`_kth` finds 16 bits of the key per reading until few values share them: with COLLECT
    at 3, negative, equal and tiny values, the even and odd counts."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.normal(0, 5, 300), np.full(40, 2.5), [-0.0, 0.0, 1e-300, -1e300, 7.0]])
    rng.shuffle(values)
    monkeypatch.setattr(SP, "COLLECT", 3)
    for n in (len(values), len(values) - 1):
        files = []
        for k, chunk in enumerate(np.array_split(values[:n], 4)):
            files.append(tmp_path / f"{n}-{k}.parquet")
            pq.write_table(pa.table({"nll": chunk}), files[-1])
        assert SP._median(files, n) == np.median(values[:n])
    same = tmp_path / "same.parquet"
    pq.write_table(pa.table({"nll": np.full(10, 3.25)}), same)
    assert SP._median([same], 10) == 3.25


def test_an_interrupted_run_resumes_without_scoring_a_part_again(table, run, tmp_path):
    out = tmp_path / "out"
    uninterrupted = tmp_path / "whole"
    SP.score_parts(StandIn(run), SP.partition(table, uninterrupted, bucket_rows=150), context=8)

    class Stop(Exception):
        pass

    def stop(done, total):
        if SO.part_path(out, 0).exists():
            raise Stop

    first = StandIn(run)
    with pytest.raises(Stop):
        SP.score_parts(first, SP.partition(table, out, bucket_rows=150), context=8, progress=stop)
    written = SO.part_path(out, 0).stat().st_mtime_ns
    assert not SO.part_path(out, 1).exists() and not SO.is_score_output(out)  # unfinished: no manifest
    seen = []
    again = StandIn(run)
    manifest = SP.score_parts(again, SP.partition(table, out, bucket_rows=150), context=8,
                              progress=lambda done, total: seen.append((done, total)))
    assert manifest["parts_resumed"] == 1 and SO.part_path(out, 0).stat().st_mtime_ns == written
    assert seen[0] == (manifest["rows_resumed"], 598) and seen[-1] == (598, 598)
    _same_columns(_parts(out), _parts(uninterrupted))
    assert SO.read_meta(out)["rows_read"] == 600 and SO.is_score_output(out)
    whole = StandIn(run)
    SP.score_parts(whole, SP.partition(table, tmp_path / "third", bucket_rows=150), context=8)
    assert first.passes + again.passes == whole.passes  # what the first run did was not done again


def test_resuming_with_other_settings_is_refused_naming_them(table, run, tmp_path):
    out = tmp_path / "out"

    def stop(done, total):
        if SO.part_path(out, 0).exists():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        SP.score_parts(StandIn(run), SP.partition(table, out, bucket_rows=150), context=8, progress=stop)
    part = SP.partition(table, out, bucket_rows=150)
    with pytest.raises(UsageError, match=r"context: 8 there, 4 now") as e:
        SP.score_parts(StandIn(run), part, context=4)
    assert "remove the directory" in str(e.value)
    with pytest.raises(UsageError, match="context_policy: 'stream' there, 'probe' now"):
        SP.score_parts(StandIn(run), part, context=8, context_policy="probe")
    with pytest.raises(UsageError, match="bucket_rows: 150 there, 100 now"):
        SP.partition(table, out, bucket_rows=100)
    with pytest.raises(UsageError, match="limit: None there, 500 now"):
        SP.partition(table, out, limit=500, bucket_rows=150)
    b = table / "b.parquet"
    was = b.stat().st_mtime_ns
    os.utime(b, ns=(was, was + 10**9))  # the table written again since
    with pytest.raises(UsageError, match=r"files: 2 file\(s\) of [\d,]+ bytes, the last modified .* there"):
        SP.partition(table, out, bucket_rows=150)
    os.utime(b, ns=(was, was))
    # with its own settings it finishes
    assert SP.score_parts(StandIn(run), part, context=8)["parts_resumed"] == 1


@pytest.mark.parametrize("policy, says", [("both", "the destination's measurements from other sources"),
                                          ("pair", "whichever probe sent them")])
def test_policies_reading_other_probes_are_refused_for_a_directory(table, tmp_path, policy, says):
    with pytest.raises(UsageError, match=says) as e:
        SP.check_options(context_policy=policy)
    assert "--limit" in str(e.value) and "a file" in str(e.value)
    r = runner.invoke(app, ["score", "no-run", str(table), "-o", str(tmp_path / "scores"), "--context-policy", policy,
                            "--json"])
    message = json.loads(r.stdout)["error"]["message"]
    assert r.exit_code == 2 and "cannot be scored in buckets of probes" in message, r.output
    assert not (tmp_path / "scores").exists()


def test_a_table_beyond_the_bound_with_a_file_output_is_told_of_directories(table, run, tmp_path, monkeypatch):
    monkeypatch.setattr(S, "MAX_ROWS", 500)
    r = runner.invoke(app, ["score", str(run), str(table), "-o", str(tmp_path / "s.parquet"), "--json"])
    message = json.loads(r.stdout)["error"]["message"]
    assert r.exit_code == 2 and "give -o a directory" in message and "--limit" in message, r.output
    assert "has 600 rows, beyond the bound of 500" in message


def test_directory_outputs_are_checked_before_any_work(table, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, says in ((foreign, "holds other files than scores"), (afile, "is a file"),
                      (table, "holds the table being scored"), (tmp_path, "holds the table being scored"),
                      (tmp_path / "s.txt", "or a directory name (no suffix)")):
        r = runner.invoke(app, ["score", "no-run", str(table), "-o", str(out)], terminal_width=400)
        assert r.exit_code == 2 and says in " ".join(r.output.split()), (out, r.output)
    assert (foreign / "notes.txt").read_text() == "keep" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def test_a_finished_directory_is_a_score_output_and_a_table(table, run, tmp_path):
    out = tmp_path / "out"
    SP.score_parts(StandIn(run), SP.partition(table, out, bucket_rows=150), context=8)
    meta = SO.read_meta(out)
    assert meta["kind"] == "scores" and meta["rows_scored"] == 598 and SO.is_score_output(out)
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["rows"] == 598, r.output
    # a rerun starts over: the finished output is replaced, never mixed with new parts
    part = SP.partition(table, out, bucket_rows=300)
    assert not (out / "manifest.json").exists() and not list(out.glob("part-*"))
    SP.score_parts(StandIn(run), part, context=8)
    assert SO.read_meta(out)["bucket_rows"] == 300


# ----------------------------------------------------------------- with the trained tiny model


@pytest.fixture(scope="module")
def probes_table(time_split, tmp_path_factory) -> Path:
    """The test split's rows of five probes, and two rows build-rows rejects."""
    import pyarrow.compute as pc

    t = pq.read_table(time_split / "test")
    probes = sorted(set(t.column("prb_id").to_pylist()))[:5]
    t = t.filter(pc.is_in(t.column("prb_id"), pa.array(probes, t.column("prb_id").type)))
    bad = t.slice(0, 2).to_pylist()
    bad[0]["rtt"], bad[1]["src_addr"] = 1e300, "not-an-address"
    path = tmp_path_factory.mktemp("parts") / "probes.parquet"
    pq.write_table(pa.concat_tables([t.slice(0, 40), pa.Table.from_pylist(bad, schema=t.schema), t.slice(40)]), path)
    return path


@pytest.mark.parametrize("policy", ["stream", "probe"])
def test_a_trained_models_bucketed_scores_are_its_whole_tables_to_the_bit(tiny_run, probes_table, tmp_path, policy):
    """Batches of other rows give a row's passes other shapes; the model runs each sequence at
    a shape of its own while scoring (`LoadedModel.shape_stable`), so its scores do not move."""
    from pingctl.infer.model import LoadedModel

    model = LoadedModel.load(tiny_run)
    whole = S.score_table(model, probes_table, context=16, context_policy=policy)
    out = tmp_path / "out"
    manifest = SP.score_parts(model, SP.partition(probes_table, out, bucket_rows=whole.num_rows // 4),
                              context=16, context_policy=policy)
    assert manifest["parts"] >= 3 and manifest["rows_rejected"] == 2
    _same_columns(_parts(out), whole)


def test_the_command_writes_a_directory_and_resumes_it(tiny_run, probes_table, tmp_path, monkeypatch):
    one = tmp_path / "scores.parquet"
    r = runner.invoke(app, ["score", str(tiny_run), str(probes_table), "-o", str(one), "--threshold", "0.05", "--json"])
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    out = tmp_path / "scores"
    calls = []
    real = SO.write_scores

    def write_then_stop(table, where):
        calls.append(where)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(table, where)

    monkeypatch.setattr(SO, "write_scores", write_then_stop)
    args = ["score", str(tiny_run), str(probes_table), "-o", str(out), "--threshold", "0.05", "--bucket-rows", "300"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 130 and "the same command resumes" in json.loads(r.stdout)["error"]["message"], r.output
    assert SO.part_path(out, 0).exists() and not SO.is_score_output(out)
    monkeypatch.setattr(SO, "write_scores", real)
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["parts"] >= 3 and got["parts_resumed"] == 1 and got["rows_per_s"] > 0
    for k in ("rows_read", "rows_scored", "rows_rejected", "rejected", "failed", "nll_median", "below_0.01",
              "flagged", "top", "context_policy"):
        assert got[k] == want[k], k
    assert got["nll_mean"] == pytest.approx(want["nll_mean"], rel=1e-12)
    _same_columns(_parts(out), pq.read_table(one))  # the file's rows, to the bit
    # the terminal: the summary says how many parts there are
    shutil.rmtree(out)
    r = runner.invoke(app, args, terminal_width=200)
    assert r.exit_code == 0 and "parts (buckets of probes)" in r.output and "set aside" in r.output, r.output


def test_the_cli_s_bucket_default_is_the_library_s():
    # the CLI keeps its own copy (it imports nothing heavy at start-up)
    from pingctl.cli import score_cmd

    assert score_cmd.BUCKET_ROWS == SP.BUCKET_ROWS
