"""Holding under faults and limits: a killed parent takes its workers with it, a full disk is
an environment error naming the path (exit 1, never "internal error"), and IPv4-mapped IPv6
addresses get one rule everywhere (rejected as `ipv4_mapped`)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.cli.app import app
from pingctl.ingest.core import ingest_bytes
from pingctl.ingest.parse import Options, reconcile
from tests.conftest import make_table

runner = CliRunner()
T0 = 1_700_000_000
MARK = "PINGCTL_TEST_PROCESS_MARK"


def result(**kw) -> dict:
    d = {"fw": 5080, "af": 4, "dst_addr": "8.8.8.8", "dst_name": "8.8.8.8", "src_addr": "192.168.1.10",
         "from": "81.2.3.4", "proto": "ICMP", "size": 48, "result": [{"rtt": 10.5}, {"rtt": 11.25}, {"x": "*"}],
         "msm_id": 1001, "prb_id": 7, "timestamp": T0, "type": "ping"}
    d.update(kw)
    return d


def _pingctl(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pingctl", *map(str, args)], capture_output=True, text=True,
                          env=env, **kw)


# ---------------------------------------------------------------- A: workers die with their parent

def _marked(mark: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment carries `mark` (what the
    run started, at any depth: spawn workers and the resource tracker inherit the environment)."""
    found = {}
    needle = f"{MARK}={mark}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                stat = (d / "stat").read_text()
                if stat[stat.rindex(")") + 2] == "Z":
                    continue  # a zombie holds nothing; its parent (pid 1) reaps it
                found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _kill_and_expect_none_left(parent: subprocess.Popen, mark: str, within_s: float) -> None:
    """kill -9 `parent`, then require every process carrying `mark` gone within `within_s`."""
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    left: dict = {}
    deadline = time.time() + within_s
    while time.time() < deadline:
        left = _marked(mark)
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"still running {within_s:g} s after the parent's kill -9: {left}"


def _cleanup(parent: subprocess.Popen, mark: str) -> None:
    if parent.poll() is None:
        parent.kill()
        parent.wait()
    _kill_all(_marked(mark))


def _busy_input(path: Path, results: int) -> Path:
    """A gzip file of `results` ping results that keeps an ingest worker busy for seconds while
    costing little to make: one compressed member, repeated (gzip members concatenate)."""
    block = 5_000
    member = gzip.compress(b"".join(orjson.dumps(result(timestamp=T0 + i, prb_id=i)) + b"\n" for i in range(block)),
                           compresslevel=1)
    with open(path, "wb") as f:
        for _ in range(results // block):
            f.write(member)
    return path


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc to find the run's processes")
def test_a_killed_ingest_takes_its_workers_and_resource_tracker_with_it(tmp_path):
    """`pingctl ingest a b -o out` killed with SIGKILL used to leave its spawn workers and the
    multiprocessing resource tracker running (parent pid 1) until they finished or forever."""
    files = [_busy_input(tmp_path / f"{n}.jsonl.gz", 2_000_000) for n in "ab"]
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    parent = subprocess.Popen([sys.executable, "-m", "pingctl", "ingest", *map(str, files), "-o", str(tmp_path / "out"),
                               "--workers", "2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        workers: dict = {}
        while time.time() < deadline and parent.poll() is None:
            procs = _marked(mark)
            workers = {p: c for p, c in procs.items() if p != parent.pid and "spawn_main" in c}
            if len(workers) >= 2:
                break
            time.sleep(0.1)
        assert parent.poll() is None, "ingest ended before its workers were seen: make the inputs bigger"
        assert len(workers) >= 2, _marked(mark)
        time.sleep(1.0)  # the workers are at work (importing, then reading their file)
        _kill_and_expect_none_left(parent, mark, 10)
    finally:
        _cleanup(parent, mark)


_LOADER = """
import sys, time
from pingctl.config import LoaderConfig
from pingctl.loader.pipeline import make_dataset
it = iter(make_dataset(sys.argv[1], LoaderConfig(seq_len=256, batch_size=4, workers=2)))
next(it)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc to find the run's processes")
def test_a_killed_loader_takes_its_grain_workers_with_it(synth_rows):
    """A process iterating the Grain pipeline with worker processes (as `pingctl train` does on a
    machine with more than 2 cores) killed with SIGKILL used to leave the workers (~290 MB each)
    running with parent pid 1."""
    mark = uuid.uuid4().hex
    parent = subprocess.Popen([sys.executable, "-c", _LOADER, str(synth_rows / "rows")], env={**os.environ, MARK: mark},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        workers = {p: c for p, c in _marked(mark).items() if p != parent.pid}
        assert workers, "the loader started no worker process"
        _kill_and_expect_none_left(parent, mark, 15)
    finally:
        _cleanup(parent, mark)


# the child, started by a parent that prints the child's pid and sleeps: how it is made to die with it
_ARMED = {
    "prctl": ("[sys.executable, '-c', 'import os, sys, time; from pingctl.processes import die_with_parent; "
              "die_with_parent(int(sys.argv[1])); print(os.getpid(), flush=True); time.sleep(120)', str(os.getpid())]", ""),
    "watchdog-thread": ("[sys.executable, '-c', 'import os, sys, time; from pingctl.processes import die_with_parent; "
                        "die_with_parent(int(sys.argv[1]), poll_s=0.1, pdeathsig=False); print(os.getpid(), flush=True); "
                        "time.sleep(120)', str(os.getpid())]", ""),
    # bench's run_measured: a plain program (here sleep) armed between fork and exec
    "preexec (bench)": ("[sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); time.sleep(120)']",
                        ", preexec_fn=die_with_us()"),
}


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc to see the grandchild")
@pytest.mark.parametrize("how", list(_ARMED))
def test_die_with_parent_kills_a_child_whose_parent_is_gone(how):
    """The helpers themselves (what ingest's pool and bench's measured commands rely on): a child
    armed with them ends within a second or so of its parent's kill -9."""
    argv, extra = _ARMED[how]
    code = ("import os, subprocess, sys, time\n"
            "from pingctl.processes import die_with_us\n"
            f"child = subprocess.Popen({argv}, stdout=subprocess.PIPE{extra})\n"
            "print(child.stdout.readline().decode().strip(), flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    grandchild = None
    try:
        grandchild = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        deadline = time.time() + 5
        while time.time() < deadline and not _zombie(grandchild):
            time.sleep(0.05)
        assert _zombie(grandchild), f"{how}: the child outlived its parent's kill -9 by 5 s"
    finally:
        if parent.poll() is None:
            parent.kill()
        if grandchild is not None:
            _kill_all([grandchild])


def _zombie(pid: int) -> bool:
    """Gone, or a zombie (dead, not yet reaped by pid 1)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


# ---------------------------------------------------------------- B: a full disk is the environment's

@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a new tmpfs of that size (root only; skipped where mounting is not allowed)."""
    mounted = []

    def mount(size: str) -> Path:
        d = tmp_path / f"small{len(mounted)}"
        d.mkdir()
        if not shutil.which("mount"):
            pytest.skip("no mount(8) to make a small file system")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs (needs root or CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounted.append(d)
        return d

    try:
        yield mount
    finally:
        for d in mounted:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _full_disk_checks(r: subprocess.CompletedProcess, out: Path) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "no space left on device" in r.stderr and str(out) in r.stderr, r.stderr
    assert "free of" in r.stderr, r.stderr  # the file system's free space, as it is now
    err = json.loads(r.stdout)["error"]  # --json: the same, as one object on stdout
    assert err["exit_code"] == 1 and err["kind"] == "input" and str(out) in err["message"]
    # atomic: nothing that looks complete, and no temp sibling left to fill the disk
    assert not out.exists(), sorted(out.parent.iterdir())
    assert list(out.parent.iterdir()) == [], sorted(out.parent.iterdir())


def test_a_full_disk_is_an_environment_error_naming_the_path(tmp_path, small_disk):
    """ingest, shard and build-rows writing into a small tmpfs used to exit 70 ("internal error:
    OSError: [Errno 28] ... please report it"; DuckDB's TransactionException and ArrayRecord's
    RuntimeError the same)."""
    import random

    disk = small_disk("512k")

    rng = random.Random(0)  # random RTTs: a Parquet output of ~1.2 MB, twice the disk
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(orjson.dumps(result(timestamp=T0 + i, prb_id=i % 500, src_addr=f"193.0.{i % 200}.1",
                                                 dst_addr=f"8.8.{i % 150}.8",
                                                 result=[{"rtt": rng.uniform(1, 300)} for _ in range(3)])) + b"\n"
                            for i in range(45_000)))
    for n, files in ((1, [src]), (2, [src, shutil.copy(src, tmp_path / "in2.jsonl")])):  # in process, and in workers
        out = disk / "ingest"
        r = _pingctl("ingest", *files, "-o", out, "--workers", n, "--json")
        _full_disk_checks(r, out)

    from pingctl.config import ShardConfig
    from pingctl.shard import shard

    table = tmp_path / "table"  # the same results on a roomy disk: 135k rows
    assert _pingctl("ingest", src, "-o", table).returncode == 0
    out = disk / "shard"
    _full_disk_checks(_pingctl("shard", table, "-o", out, "--json"), out)

    split = tmp_path / "split"
    shard([table], split, ShardConfig(strategy="random", val_fraction=0.0, test_fraction=0.0))
    out = disk / "rows"
    _full_disk_checks(_pingctl("build-rows", split / "train", "-o", out, "--json"), out)


def test_the_handler_maps_every_form_of_a_full_disk_to_exit_1(tmp_path):
    """The forms a full disk takes (Python's OSError with or without a file name, EDQUOT, pyarrow's
    OSError, DuckDB's and ArrayRecord's own types that only say it in their text, an error raised
    while handling one): exit 1 with the path, never exit 70. What train's parent process raises
    when its metrics or log write meets a full disk takes the first of these forms."""
    import errno

    import typer

    from pingctl.cli.common import handle_errors

    class TransactionException(Exception):  # DuckDB's, by name and message
        pass

    run = tmp_path / "run"
    cases = [
        ({"run_dir": run}, OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
        ({"out": None}, OSError(errno.ENOSPC, "No space left on device", str(run / "metrics.jsonl")),
         "no space left on device"),
        ({"out": run}, OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), "disk quota exceeded"),
        ({"out": run}, OSError(28, "Error writing bytes to file. Detail: [errno 28] No space left on device"),
         "no space left on device"),
        ({"out": None}, TransactionException(f'Failed to commit: Could not write file "{run}/x.wal": '
                                              "No space left on device"), "no space left on device"),
        ({"out": run}, RuntimeError(f"write() failed: No space left on device; writing {run}/rows-0.arrayrecord; at "
                                    "byte 0"), "no space left on device"),
    ]
    chained = ValueError("closing failed")
    chained.__context__ = OSError(errno.ENOSPC, "No space left on device")
    cases.append(({"out": run}, chained, "no space left on device"))
    for kwargs, exc, words in cases:

        @handle_errors
        def command(**kw):
            raise exc

        with pytest.raises(typer.Exit) as got:
            command(**kwargs)
        assert got.value.exit_code == 1, exc
    # and one that is not: still an internal error
    @handle_errors
    def broken(**kw):
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(typer.Exit) as got:
        broken(out=run)
    assert got.value.exit_code == 70


def test_the_full_disk_message_names_the_path_and_the_free_space(tmp_path, capsys):
    import errno

    import typer

    from pingctl.cli.common import handle_errors

    @handle_errors
    def command(out, as_json=False):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(typer.Exit):
        command(out=tmp_path / "not" / "yet", as_json=True)
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["kind"] == "input" and err["exit_code"] == 1
    assert err["message"].startswith(f"no space left on device writing {tmp_path / 'not' / 'yet'}; its file system "
                                     f"({tmp_path}) has ") and " free of " in err["message"]


def test_train_on_a_full_disk_exits_1_and_inspect_names_the_leftover_temp_checkpoint(tmp_path, small_disk):
    """A tiny run writing into a 2 MB tmpfs: the disk fills while MaxText writes its first
    checkpoints. It used to end in "internal error: OSError: [Errno 28]" (exit 70) when the parent
    met the full disk first; either way it must exit 1, name the run directory and never say
    "internal error". A `N.orbax-checkpoint-tmp` left there is listed by `inspect`."""
    pytest.importorskip("maxtext")
    from pingctl.records.build import build_rows

    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(make_table(4000, probes=20, targets=5), table / "t.parquet")
    rows = tmp_path / "rows"
    build_rows([table], rows)
    run = small_disk("2m") / "run"
    r = _pingctl("train", rows, "--run-dir", run, "--steps", "3", "--set", "loader.seq_len=128", "--set",
                 "loader.batch_size=8", "--set", "train.eval_interval=-1", "--json", timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "internal error" not in r.stderr and str(run) in r.stderr, r.stderr[-3000:]
    # whichever process met the full disk first (pingctl or the MaxText worker), the message says so
    assert "no space left on device" in r.stderr.lower(), r.stderr[-3000:]
    err = json.loads(r.stdout)["error"]
    assert err["exit_code"] == 1 and err["kind"] == "input"
    # what inspect reports of the run the full disk cut short
    temps = [p.name for p in (run / "maxtext" / "checkpoints").iterdir() if "orbax-checkpoint-tmp" in p.name] \
        if (run / "maxtext" / "checkpoints").is_dir() else []
    i = _pingctl("inspect", run, "--json")
    assert i.returncode == 0, i.stderr
    got = json.loads(i.stdout)["temp_checkpoint_dirs"]
    assert [t["name"] for t in got] == sorted(temps)
    assert all(t["bytes"] >= 0 for t in got)


def test_inspect_lists_temporary_checkpoint_directories(tmp_path):
    from pingctl.artifacts.run import temp_checkpoint_dirs

    ck = tmp_path / "run" / "maxtext" / "checkpoints"
    (ck / "0").mkdir(parents=True)
    (ck / "0" / "commit_success.txt").write_text("")
    (ck / "2.orbax-checkpoint-tmp" / "items").mkdir(parents=True)
    (ck / "2.orbax-checkpoint-tmp" / "items" / "blob").write_bytes(b"x" * 1000)
    (ck / "4.orbax-checkpoint-tmp-1732712345").mkdir()
    assert temp_checkpoint_dirs(tmp_path / "run") == [{"name": "2.orbax-checkpoint-tmp", "bytes": 1000},
                                                      {"name": "4.orbax-checkpoint-tmp-1732712345", "bytes": 0}]
    assert temp_checkpoint_dirs(tmp_path / "nothing") == []


# ---------------------------------------------------------------- C: IPv4-mapped IPv6 addresses

MAPPED = ("::ffff:34.159.150.238", "::ffff:229f:96ee", "::FFFF:8.8.8.8")


def test_ingest_rejects_ipv4_mapped_addresses_and_counts_reconcile(tmp_path):
    """An af-6 result whose destination is ::ffff:229f:96ee used to be written as an IPv6 row."""
    recs = [
        result(),
        result(af=6, dst_addr="::ffff:229f:96ee", dst_name="example.net", src_addr="2a00:1::1", **{"from": "2a00:1::1"}),
        result(af=6, dst_addr="2600::8", src_addr="::ffff:34.159.150.238", **{"from": "::ffff:34.159.150.239"}),
        result(af=6, dst_addr="2600::8", src_addr="2a00:1::1", **{"from": "2a00:1::1"}),
        result(af=4, dst_addr="::FFFF:8.8.8.8"),
    ]
    data = b"".join(orjson.dumps(x) + b"\n" for x in recs)
    for fast in (True, False):  # the msgspec fast path and the generic path agree
        table, counts, rejects = ingest_bytes(data, Options(), fast=fast)
        assert reconcile(counts) == []
        assert counts["rejected"] == {"ipv4_mapped": 3} and counts["results_written"] == 2
        assert [(r["line"], r["reason"]) for r in rejects] == [(2, "ipv4_mapped"), (3, "ipv4_mapped"), (5, "ipv4_mapped")]
        assert "34.159.150.238" in rejects[0]["detail"]
        assert not any(a.lower().startswith("::ffff:") for a in table.column("dst_addr").to_pylist()
                       + table.column("src_addr").to_pylist())
    src = tmp_path / "r.jsonl"
    src.write_bytes(data)
    r = runner.invoke(app, ["ingest", str(src), "-o", str(tmp_path / "out"), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["records"] == s["results_written"] + s["rejected_total"] + s["filtered_total"] + s["summary_only"]
    assert s["rejected"] == {"ipv4_mapped": 3}
    lines = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [x["reason"] for x in lines] == ["ipv4_mapped"] * 3


def test_parquet_checks_reject_ipv4_mapped_rows_in_shard_build_rows_and_inspect(tmp_path):
    """The canonical table's check (inspect, shard, build-rows) kept such rows as IPv6."""
    t = make_table(400, probes=8, targets=4, v6_every=2)
    src = t.column("src_addr").to_pylist()
    dst = t.column("dst_addr").to_pylist()
    ipv = t.column("ip_version").to_pylist()
    src[3], ipv[3] = MAPPED[0], 6  # written as IPv6, as an af-6 result would have it
    dst[10], ipv[10] = MAPPED[1], 6
    dst[11], ipv[11] = MAPPED[2], 4
    t = t.set_column(t.schema.get_field_index("src_addr"), "src_addr", pa.array(src, pa.string()))
    t = t.set_column(t.schema.get_field_index("dst_addr"), "dst_addr", pa.array(dst, pa.string()))
    t = t.set_column(t.schema.get_field_index("ip_version"), "ip_version", pa.array(ipv, pa.int64()))
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(t, d / "t.parquet")

    r = runner.invoke(app, ["inspect", str(d), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["invalid_by_reason"] == {"ipv4_mapped": 3}

    r = runner.invoke(app, ["shard", str(d), "-o", str(tmp_path / "sh"), "--strategy", "random", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["rejects_by_reason"] == {"ipv4_mapped": 3} and s["rows_read"] == 400 and s["rows_written"] == 397
    rejects = [json.loads(x) for x in (tmp_path / "sh" / "rejects.jsonl").read_text().splitlines()]
    assert sorted((x["row"], x["reason"]) for x in rejects) == [(3, "ipv4_mapped"), (10, "ipv4_mapped"),
                                                                (11, "ipv4_mapped")]
    kept = pq.read_table(tmp_path / "sh" / "train").to_pylist() if (tmp_path / "sh" / "train").exists() else []
    assert not any(":ffff:" in row["src_addr"] + row["dst_addr"] for row in kept)

    r = runner.invoke(app, ["build-rows", str(d), "-o", str(tmp_path / "rows"), "--json"])
    assert r.exit_code == 0, r.output
    b = json.loads(r.stdout)
    assert b["rejects_by_reason"] == {"ipv4_mapped": 3} and b["rows_read"] == 400 and b["rows_rejected"] == 3


def test_one_rule_for_mapped_addresses_ingest_parquet_tokenizer_and_sample(tmp_path):
    """Every reader refuses the same spellings, and `sample` keeps its refusal (asked before any
    model is loaded, so no run is needed)."""
    from pingctl.infer.pairs import AddressError, check_measurable
    from pingctl.schema.addresses import address_map, ipv4_mapped, packed_address, parse_address

    for text in MAPPED:
        assert parse_address(text) is None and packed_address(text) is None
        assert ipv4_mapped(text) is not None
        with pytest.raises(AddressError) as e:
            check_measurable(text)
        assert e.value.reason == "ipv4_mapped"
    m = address_map([*MAPPED, "64:ff9b::1.2.3.4", "1.2.3.4", "x"]).to_pylist()
    assert [r["mapped"] for r in m] == [True, True, True, False, False, False]
    assert parse_address("64:ff9b::1.2.3.4") == ("64:ff9b::102:304", 6)  # NAT64 is an IPv6 path: kept

    for text, v4 in (("::ffff:1.2.3.4", "1.2.3.4"), ("::ffff:229f:96ee", "34.159.150.238")):
        r = runner.invoke(app, ["sample", str(tmp_path / "no-run"), "--src", text, "--dst", "8.8.8.8"])
        assert r.exit_code == 2, r.output
        assert "IPv4-mapped IPv6 address" in r.output and f"ask for {v4}" in r.output, r.output
        r = runner.invoke(app, ["tokenize", "--src", "8.8.8.8", "--dst", text, "--rtt", "3"])
        assert r.exit_code == 2, r.output
        assert "IPv4-mapped IPv6 address" in r.output and f"give {v4}" in r.output, r.output


def _failing_app(exc: BaseException):
    """A one-command app whose command raises `exc` through the CLI's error handler."""
    import typer

    from pingctl.cli.common import handle_errors

    one = typer.Typer()

    @one.command()
    @handle_errors
    def go(as_json: bool = typer.Option(False, "--json")) -> None:
        raise exc

    return one


@pytest.mark.parametrize("exc, code", [(RuntimeError("a bug"), 70), (ValueError("another bug"), 70)])
def test_pingctl_debug_shows_the_traceback_and_keeps_the_exit_code(monkeypatch, exc, code):
    """PINGCTL_DEBUG=1 once re-raised, so Python's own exit status 1 replaced the internal error's 70."""
    from typer.testing import CliRunner

    from pingctl.errors import PingctlError, UsageError

    runner = CliRunner()
    monkeypatch.delenv("PINGCTL_DEBUG", raising=False)
    plain = runner.invoke(_failing_app(exc), ["--json"])
    assert plain.exit_code == code and "Traceback" not in plain.stderr and "PINGCTL_DEBUG=1" in plain.stderr
    monkeypatch.setenv("PINGCTL_DEBUG", "1")
    for e, want in ((exc, code), (PingctlError("bad row 3"), 1), (UsageError("bad option"), 2)):
        r = runner.invoke(_failing_app(e), ["--json"])
        assert r.exit_code == want, (e, r.exit_code, r.output)
        assert "Traceback (most recent call last)" in r.stderr and type(e).__name__ in r.stderr, r.stderr
        assert json.loads(r.stdout)["error"]["exit_code"] == want  # --json still says why, on stdout


def test_json_output_never_holds_nan_or_infinity(capsys):
    """NaN is not JSON: `"p_fail": NaN` on stdout made the whole --json document unreadable to a
    standard parser. Each such value prints as null, and "non_finite" says which and why."""
    import numpy as np

    from pingctl.cli.common import emit

    def strict(text):
        def refuse(token):
            raise ValueError(f"{token} is not JSON")

        return json.loads(text, parse_constant=refuse)

    emit({"p_fail": float("nan"), "quantiles": {"0.5": float("inf"), "0.95": 3.5}, "rows": [{"x": np.float32("nan")},
          {"x": -np.inf}, {"x": np.float64(1.25)}], "n": 3}, as_json=True)
    out, err = capsys.readouterr()
    got = strict(out)
    assert got["p_fail"] is None and got["quantiles"] == {"0.5": None, "0.95": 3.5} and got["n"] == 3
    assert [r["x"] for r in got["rows"]] == [None, None, 1.25]
    assert got["non_finite"] == {"p_fail": "NaN", "quantiles.0.5": "Infinity", "rows[0].x": "NaN",
                                 "rows[1].x": "-Infinity"}
    assert "4 value(s) are not finite" in err
    emit({"p_fail": 0.25}, as_json=True)
    out, err = capsys.readouterr()
    assert strict(out) == {"p_fail": 0.25} and err == ""
