"""`pingctl train --target modal`, `--status/--follow` and `pingctl pull`: pingctl's own logic.

Modal cannot be reached from here, so nothing below contacts it. What is tested is what pingctl
decides and does at the volume boundary: remote naming, the upload plan by the rows' sha256s,
`--fresh` deletion, the resume checks against what the volume holds, the container's code path
(run_in_container, on a directory standing in for the mounted volume) and the pull into a run
directory that `inspect` and `sample` take, plus the errors a user meets without a token.
`DirVolume` stands in for `modal.Volume` behind the same small interface (pingctl.executor.modal.volume.Volume).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pingctl.artifacts.remote import read_remote, write_remote
from pingctl.artifacts.run import checkpoint_steps, is_run_dir, run_config
from pingctl.cli.app import app
from pingctl.config import load_config
from pingctl.errors import PingctlError, UsageError
from pingctl.executor.modal import pull as P
from pingctl.executor.modal import sync as S
from pingctl.executor.modal.volume import Entry, credentials_source, modal_errors, norm
from pingctl.train import metrics as M
from pingctl.train.render import render_maxtext

runner = CliRunner()


class DirVolume:
    """A local directory behaving as pingctl's Volume interface says a Modal volume does."""

    def __init__(self, root: Path, name: str = "test-volume"):
        self.root, self.name = Path(root), name
        self.root.mkdir(parents=True, exist_ok=True)
        self.uploaded: list[str] = []
        self.downloads = 0

    def listdir(self, path: str, recursive: bool = False) -> list[Entry]:
        base = self.root / norm(path)
        if base.is_file():
            return [Entry(norm(path), False, base.stat().st_size)]
        if not base.is_dir():
            return []
        found = base.rglob("*") if recursive else base.iterdir()
        return [Entry(p.relative_to(self.root).as_posix(), p.is_dir(), p.stat().st_size if p.is_file() else 0)
                for p in sorted(found)]

    def read(self, path: str) -> bytes | None:
        p = self.root / norm(path)
        return p.read_bytes() if p.is_file() else None

    def download(self, path: str, dest: Path) -> None:
        self.downloads += 1
        shutil.copyfile(self.root / norm(path), dest)

    def upload(self, files) -> None:
        for local, remote in files:
            dst = self.root / norm(remote)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, dst)
            self.uploaded.append(norm(remote))

    def remove(self, path: str) -> None:
        p = self.root / norm(path)
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


@pytest.fixture
def two_splits(synth_rows, tmp_path):
    """Train and eval rows of our own (the tests change their files)."""
    train, ev = tmp_path / "rows" / "train", tmp_path / "rows" / "eval"
    shutil.copytree(synth_rows / "rows", train)
    shutil.copytree(synth_rows / "rows", ev)
    return train, ev


def _cfg(train: Path, ev: Path | None = None, *extra: str):
    return load_config(None, [f"train.train_rows={train.resolve()}", *([f"train.eval_rows={ev.resolve()}"] if ev else []),
                              "train.target=modal", *extra])


def test_remote_names_are_unique_per_run_directory(tmp_path, monkeypatch):
    a, b = tmp_path / "proj-a" / "runs" / "train", tmp_path / "proj-b" / "runs" / "train"
    na, nb = S.default_name(a), S.default_name(b)
    assert na != nb and na.startswith("train-") and nb.startswith("train-")
    # the same directory however it is written
    (tmp_path / "proj-a").mkdir()
    monkeypatch.chdir(tmp_path / "proj-a")
    assert S.default_name(Path("runs/train")) == S.default_name(Path("runs/train/")) == na
    a.mkdir(parents=True)
    monkeypatch.chdir(a)
    assert S.default_name(Path(".")) == na
    # a directory name the volume would not take is made safe, the hash keeps it unique
    odd = S.default_name(tmp_path / "my run (2)")
    assert S.check_name(odd) == odd and odd.startswith("my-run-2-")
    for bad in ("../up", "a/b", "", ".hidden", "x" * 101):
        with pytest.raises(UsageError, match="--name"):
            S.check_name(bad)
    # the remote paths follow the name, never the bare directory name
    rc = S.remote_config(_cfg(tmp_path / "rows"), na)
    assert rc.train.run_dir == f"/data/runs/{na}" and rc.train.train_rows == f"/data/rows/{na}/train"
    assert rc.train.hardware == "gpu" and rc.train.jax_cache_dir == "/data/jax_cache"


def test_a_run_keeps_the_name_it_was_submitted_under(tmp_path):
    from pingctl.executor.modal.run import remote_name

    run = tmp_path / "run"
    assert remote_name(run, None) == S.default_name(run)
    run.mkdir()
    write_remote(run, "modal", name="my-exp", volume="v", call_id="fc-1")
    assert remote_name(run, None) == "my-exp"  # the same command again resumes the same remote run
    assert remote_name(run, "other") == "other"
    write_remote(run, "slurm", job_id="12")  # another engine's record names no Modal run
    assert remote_name(run, None) == S.default_name(run)


def test_upload_plan_sends_only_missing_or_changed_row_files(two_splits, tmp_path):
    train, ev = two_splits
    cfg = _cfg(train, ev)
    vol = DirVolume(tmp_path / "vol")
    first = S.plan_upload(cfg, "r1", vol)
    listed = json.loads((train / "manifest.json").read_text())["files"]
    assert len(first.upload) == 2 * (1 + len(listed)) and not first.kept and not first.remove
    assert first.bytes_up == sum(f.stat().st_size for d in (train, ev) for f in d.iterdir() if f.is_file()
                                 and (f.name == "manifest.json" or f.name in listed))
    S.apply_upload(first, vol)
    record = json.loads((vol.root / "rows/r1/uploaded.json").read_text())
    assert record[f"rows/r1/train/{listed[0]}"]["sha256"] == S.sha256_file(train / listed[0])
    assert (vol.root / "rows/r1/eval/manifest.json").read_bytes() == (ev / "manifest.json").read_bytes()

    again = S.plan_upload(cfg, "r1", vol)  # the same command again: nothing to send
    assert again.upload == [] and len(again.kept) == len(first.upload)

    # a file changed here in place (same size: only its sha256 tells), one cut short on the
    # volume, one missing there, and a stale one there that no manifest lists any more
    changed = train / listed[0]
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    changed.write_bytes(bytes(data))
    cut = vol.root / f"rows/r1/eval/{listed[-1]}"
    cut.write_bytes(cut.read_bytes()[:10])
    (vol.root / "rows/r1/eval/manifest.json").unlink()
    (vol.root / "rows/r1/train/old-00009.arrayrecord").write_bytes(b"stale")
    plan = S.plan_upload(cfg, "r1", vol)
    assert sorted(v for _, v in plan.upload) == sorted(
        [f"rows/r1/train/{listed[0]}", f"rows/r1/eval/{listed[-1]}", "rows/r1/eval/manifest.json"])
    assert plan.remove == ["rows/r1/train/old-00009.arrayrecord"]
    S.apply_upload(plan, vol)
    assert not (vol.root / "rows/r1/train/old-00009.arrayrecord").exists()
    assert S.plan_upload(cfg, "r1", vol).upload == []

    # a damaged record proves nothing: everything goes up again
    (vol.root / "rows/r1/uploaded.json").write_text("{not json")
    assert len(S.plan_upload(cfg, "r1", vol).upload) == len(first.upload)
    # a file the manifest lists but the rows lack is an error naming it, before anything is sent
    (train / listed[0]).unlink()
    with pytest.raises(PingctlError, match=f"{listed[0]}: listed in"):
        S.plan_upload(cfg, "r1", vol)


def test_a_hints_file_goes_up_beside_the_rows_and_comes_back_local(two_splits, tmp_path):
    """loader.hints_file: uploaded once beside the rows, named by the container's config, and the
    pulled run's config names this machine's file again."""
    train, _ = two_splits
    hints = tmp_path / "hints.npz"
    hints.write_bytes(b"hints")  # the plan only hashes it
    cfg = _cfg(train, None, f"loader.hints_file={hints}", "loader.triangulation_share=0.5")
    vol = DirVolume(tmp_path / "vol")
    plan = S.plan_upload(cfg, "r1", vol)
    assert (hints, "rows/r1/hints.npz") in plan.upload
    S.apply_upload(plan, vol)
    assert (vol.root / "rows/r1/hints.npz").read_bytes() == b"hints"
    assert S.plan_upload(cfg, "r1", vol).upload == []  # unchanged: kept there
    hints.write_bytes(b"other")
    assert [v for _, v in S.plan_upload(cfg, "r1", vol).upload] == ["rows/r1/hints.npz"]
    rc = S.remote_config(cfg, "r1")
    assert rc.loader.hints_file == "/data/rows/r1/hints.npz"
    back = P.local_config(rc, tmp_path / "run", {"hints_file": str(hints)})
    assert back.loader.hints_file == str(hints)


def _remote_run(vol: DirVolume, name: str, cfg, steps: list[int]) -> Path:
    """What a container leaves on the volume, as far as the resume checks read it."""
    run = vol.root / S.run_path(name)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(S.remote_config(cfg, name).model_dump(mode="json")))
    for s in steps:
        d = run / "maxtext" / "checkpoints" / str(s)
        d.mkdir(parents=True)
        (d / "commit_success.txt").write_text("ok")
    (run / "maxtext" / "checkpoints" / "90").mkdir()  # being written: not committed
    return run


def test_fresh_deletes_the_remote_run_first_and_a_rerun_resumes(two_splits, tmp_path):
    from pingctl.executor.modal.run import sync_for_launch

    train, _ = two_splits
    cfg = _cfg(train, None, "train.steps=200")
    vol = DirVolume(tmp_path / "vol")
    first = sync_for_launch(cfg, "r1", vol)
    assert first["upload"] > 0 and first["deleted"] == [] and first["resume_from"] is None
    run = _remote_run(vol, "r1", cfg, [50, 100])
    (vol.root / "runs" / "other").mkdir()  # another run on the same volume
    again = sync_for_launch(cfg, "r1", vol)
    assert again["upload"] == 0 and again["resume_from"] == 100 and run.is_dir()
    assert S.committed_steps(vol, "r1") == [50, 100]

    fresh = sync_for_launch(cfg, "r1", vol, fresh=True)
    assert fresh["deleted"] == ["/runs/r1", "/rows/r1"] and not run.exists()
    assert fresh["upload"] == first["upload"] and fresh["resume_from"] is None
    assert (vol.root / "runs" / "other").is_dir()


def test_resume_refusals_name_the_volume_and_change_nothing(two_splits, tmp_path):
    from pingctl.executor.modal.run import sync_for_launch

    train, _ = two_splits
    cfg = _cfg(train, None, "train.steps=200")
    vol = DirVolume(tmp_path / "vol")
    _remote_run(vol, "r1", cfg, [50, 199])
    with pytest.raises(PingctlError, match=r"Modal volume test-volume: /runs/r1 is already trained to step 200") as e:
        sync_for_launch(cfg, "r1", vol)
    assert "--steps above 200" in str(e.value) and "pingctl-modal-" not in str(e.value)
    other = _cfg(train, None, "train.steps=400", "model.preset=mini")
    with pytest.raises(PingctlError, match=r"/runs/r1 holds checkpoints of a different model \(model.preset"):
        sync_for_launch(other, "r1", vol)
    assert not (vol.root / "rows").exists()  # refused before anything was uploaded
    assert sync_for_launch(_cfg(train, None, "train.steps=400"), "r1", vol)["resume_from"] == 199


def _volume_from_run(src: Path, vol: DirVolume, name: str, mount: str = S.MOUNT) -> None:
    """A finished run as the container leaves it on the volume: its files, with the config,
    MaxText yml and summary written for the volume's paths."""
    rc = S.remote_config(run_config(src), name, mount)
    dst = vol.root / S.run_path(name)
    shutil.copytree(src / "maxtext", dst / "maxtext")
    for f in ("train.log", "metrics.jsonl", "loss.png"):
        shutil.copy(src / f, dst / f)
    summary = json.loads((src / "summary.json").read_text())
    old = summary["run_dir"]
    summary = {k: v.replace(old, rc.train.run_dir) if isinstance(v, str) else v for k, v in summary.items()}
    (dst / "summary.json").write_text(json.dumps(summary))
    (dst / "config.yaml").write_text(yaml.safe_dump(rc.model_dump(mode="json"), sort_keys=False))
    (dst / "maxtext.yml").write_text(render_maxtext(rc, Path(rc.train.run_dir)))


class CutVolume(DirVolume):
    """Its connection drops after `left` downloads."""

    def __init__(self, root: Path, left: int):
        super().__init__(root)
        self.left = left

    def download(self, path: str, dest: Path) -> None:
        if self.left <= 0:
            raise PingctlError("cannot reach Modal (connection reset); check the network and retry")
        self.left -= 1
        super().download(path, dest)


def test_pull_brings_home_a_run_that_inspect_and_sample_take(tiny_run, synth_rows, pair, tmp_path, monkeypatch):
    vol = DirVolume(tmp_path / "vol")
    _volume_from_run(tiny_run, vol, "tiny-1")
    run = tmp_path / "home" / "run"
    local = {"train_rows": str(synth_rows / "rows"), "eval_rows": None, "jax_cache_dir": str(tmp_path / "xla")}

    # a pull cut short inside a checkpoint leaves nothing that looks like one; the rerun completes it
    cut = CutVolume(vol.root, left=12)
    with pytest.raises(PingctlError, match="connection reset"):
        P.pull(run, cut, "tiny-1", local=local)
    ckpts = run / "maxtext" / "checkpoints"
    assert checkpoint_steps(run) == [] and not (ckpts.is_dir() and list(ckpts.iterdir()))
    assert not is_run_dir(run)

    res = P.pull(run, vol, "tiny-1", local=local)
    assert res["remote_checkpoints"] == [0, 59] and res["pulled_checkpoints"] == [59] and res["checkpoints"] == [59]
    assert res["summary"] and res["run_dir_ready"] and is_run_dir(run)
    assert not [p for p in ckpts.iterdir() if p.name != "59"]  # no temp left over
    cfg = run_config(run)
    assert cfg.train.run_dir == str(run.resolve()) and cfg.train.jax_cache_dir == local["jax_cache_dir"]
    assert cfg.train.train_rows == local["train_rows"] and cfg.train.target == "modal"
    assert "/data/runs/tiny-1" in (run / "modal" / "config.yaml").read_text()  # what the container ran
    assert "/data/" not in (run / "maxtext.yml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run_dir"] == str(run.resolve()) and summary["loss_png"] == str(run.resolve() / "loss.png")
    assert M.read_jsonl(run / "metrics.jsonl") == M.read_jsonl(tiny_run / "metrics.jsonl")
    assert (run / "train.log").read_bytes() == (tiny_run / "train.log").read_bytes() and (run / "loss.png").stat().st_size
    events = sorted(p.name for p in (run / "maxtext" / "tensorboard").rglob("events.*"))
    assert events == sorted(p.name for p in (tiny_run / "maxtext" / "tensorboard").rglob("events.*"))

    # again: only the small files move; then more checkpoints on request, a missing one refused
    before = vol.downloads
    assert P.pull(run, vol, "tiny-1", local=local)["pulled_checkpoints"] == []
    assert vol.downloads - before <= 6
    assert P.pull(run, vol, "tiny-1", steps="all", local=local)["checkpoints"] == [0, 59]
    with pytest.raises(PingctlError, match=r"no committed checkpoint at step 7 \(committed: 0, 59\)"):
        P.pull(run, vol, "tiny-1", steps=[7], local=local)
    with pytest.raises(PingctlError, match="no run at /runs/nope"):
        P.pull(tmp_path / "x", vol, "nope")

    d = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).stdout)
    assert d["kind"] == "run" and d["complete"] and d["last_step"] == 59 and d["checkpoints"] == [0, 59]
    # the checkpoints are the run's, byte for byte, and `sample` answers from them (the pulled
    # config says hardware gpu: asked on this CPU, as a GPU-trained run is)
    for step in (0, 59):
        src = tiny_run / "maxtext" / "checkpoints" / str(step)
        names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
        assert names == sorted(p.relative_to(ckpts / str(step)).as_posix() for p in (ckpts / str(step)).rglob("*"))
        assert all((src / n).read_bytes() == (ckpts / str(step) / n).read_bytes() for n in names if (src / n).is_file())
    for var in ("XLA_FLAGS", "JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL"):
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)
    r = runner.invoke(app, ["sample", str(run), "--src", pair[0], "--dst", pair[1], "--json"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    assert 0 <= answer["p_fail"] <= 1 and answer["p50_ms"] > 0, answer

    # a local run's directory is not a place to pull a Modal run into
    local_run = tmp_path / "local-run"
    shutil.copytree(tiny_run, local_run, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(UsageError, match="holds a local run"):
        P.pull(local_run, vol, "tiny-1")

    # the remote run started over elsewhere: its old checkpoints here would pass for the latest
    shutil.rmtree(vol.root / "runs/tiny-1/maxtext/checkpoints/59")
    with pytest.raises(PingctlError, match=r"holds checkpoint 59, newer than any on test-volume:/runs/tiny-1"):
        P.pull(run, vol, "tiny-1")
    # --fresh clears what pulls brought, and only that
    write_remote(run, "modal", name="tiny-1", volume=vol.name, call_id="fc-1")
    gone = P.clear_pulled(run)
    assert {"config.yaml", "maxtext.yml", "maxtext", "summary.json", "metrics.jsonl"} <= set(gone)
    assert sorted(p.name for p in run.iterdir()) == ["modal", "remote.json"]


def test_the_container_writes_the_run_s_outputs_to_the_volume(tiny_run, synth_rows, tmp_path, monkeypatch):
    """run_in_container, the Modal function's body, on a directory standing in for the mounted
    volume: it resumes the run there, writes train.log, metrics.jsonl, loss.png and
    summary.json beside the checkpoints and commits; the pull then has the new checkpoint."""
    from pingctl.executor.modal.container import run_in_container
    from pingctl.executor.modal.run import sync_for_launch

    vol = DirVolume(tmp_path / "vol")
    mount = str(vol.root)
    cfg = load_config(tiny_run / "config.yaml", ["train.steps=62", "train.target=modal"])
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"train_rows": str(synth_rows / "rows")})})
    sync_for_launch(cfg, "tiny-2", vol)
    _volume_from_run(tiny_run, vol, "tiny-2", mount)
    (vol.root / "runs/tiny-2/summary.json").unlink()
    remote = S.remote_config(cfg, "tiny-2", mount).model_dump(mode="json")
    remote["train"]["hardware"] = "cpu"  # no GPU here: the one change from what Modal runs
    commits = []
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    out = run_in_container(remote, lambda: commits.append(1), commit_every_s=1.0)
    assert out["ok"], out["error"]
    assert commits and out["summary"]["resumed_from_checkpoint"] == 59 and out["summary"]["last_step"] == 61
    there = vol.root / "runs" / "tiny-2"
    assert json.loads((there / "summary.json").read_text())["last_step"] == 61
    steps = [r["step"] for r in M.read_jsonl(there / "metrics.jsonl") if r["kind"] == "train"]
    assert steps[-3:] == [59, 60, 61] and (there / "loss.png").stat().st_size
    assert "resume from 59" in (there / "train.log").read_text()
    assert S.committed_steps(vol, "tiny-2")[-1] == 61

    run = tmp_path / "home"
    res = P.pull(run, vol, "tiny-2")
    assert res["pulled_checkpoints"] == [61] and is_run_dir(run)
    d = json.loads(runner.invoke(app, ["inspect", str(run), "--json"]).stdout)
    assert d["complete"] and d["last_step"] == 61

    # a failure is a value, not an exception to unpickle on the submitting machine
    again = run_in_container(remote, lambda: commits.append(1))
    assert not again["ok"] and "already trained to step 62" in again["error"]


def test_no_token_is_a_clear_error_never_an_internal_one(synth_rows, tmp_path, monkeypatch):
    for var in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "MODAL_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(tmp_path / "absent.toml"))
    assert credentials_source() is None
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", str(synth_rows / "rows"), "--run-dir", str(run), "--target", "modal"])
    assert r.exit_code == 1 and "no Modal token" in r.output and "modal token new" in r.output
    assert not (run / "remote.json").exists()
    r = runner.invoke(app, ["pull", str(run), "--name", "x", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["error"]["message"].startswith("no Modal token")
    write_remote(run, "modal", name="x", volume="v", call_id="fc-1")
    for flag in ("--status", "--follow"):
        r = runner.invoke(app, ["train", str(run), flag])
        assert r.exit_code == 1 and "no Modal token" in r.output, r.output

    # a profile in the config file counts; its secret is never repeated
    toml = tmp_path / "modal.toml"
    toml.write_text('[me]\ntoken_id = "ak-123"\ntoken_secret = "as-very-secret"\nactive = true\n')
    monkeypatch.setenv("MODAL_CONFIG_PATH", str(toml))
    assert credentials_source() == f"{toml} (profile me)"
    monkeypatch.setenv("MODAL_PROFILE", "other")
    assert credentials_source() is None
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-1")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-2")
    assert credentials_source() == "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET"


def test_modal_s_errors_are_pingctl_errors():
    import modal.exception as E

    cases = [
        (E.AuthError("Token ID is malformed"), "Modal refused the token (Token ID is malformed)"),
        (E.NotFoundError("Volume 'nope' not found in environment 'main'"), "Modal volume 'nope' not found"),
        (E.ConnectionError("Deadline exceeded"), "cannot reach Modal (Deadline exceeded)"),
        (E.InvalidError("Invalid volume name"), "Modal: InvalidError: Invalid volume name"),
    ]
    for exc, message in cases:
        with pytest.raises(PingctlError) as e:
            with modal_errors("nope"):
                raise exc
        assert str(e.value).startswith(message) and e.value.exit_code == 1
    with pytest.raises(KeyError):  # not Modal's: not disguised
        with modal_errors("nope"):
            raise KeyError("x")


def test_dry_run_and_the_pull_command_s_own_refusals(synth_rows, tmp_path, monkeypatch):
    run = tmp_path / "run"
    r = runner.invoke(app, ["train", str(synth_rows / "rows"), "--run-dir", str(run), "--target", "modal",
                            "--dry-run", "--name", "exp-7", "--json"], env={"WANDB_API_KEY": "secret-value"})
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["name"] == "exp-7" and res["run_dir"] == "/data/runs/exp-7"
    assert "/data/rows/exp-7/train" in (run / "modal" / "config.yaml").read_text()
    assert read_remote(run) is None and not is_run_dir(run)  # nothing submitted, nothing recorded
    r = runner.invoke(app, ["train", str(synth_rows / "rows"), "--run-dir", str(run), "--target", "modal",
                            "--name", "../x", "--dry-run"])
    assert r.exit_code == 2 and "--name '../x'" in r.output
    r = runner.invoke(app, ["train", str(synth_rows / "rows"), "--run-dir", str(run), "--detach"])
    assert r.exit_code == 2 and "for --target modal" in r.output

    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-1")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-2")
    r = runner.invoke(app, ["pull", str(tmp_path / "never")])
    assert r.exit_code == 1 and "pass the remote run's --name" in r.output
    write_remote(run, "slurm", job_id="12")
    r = runner.invoke(app, ["pull", str(run)])
    assert r.exit_code == 1 and "nothing to pull" in r.output
    r = runner.invoke(app, ["pull", str(run), "--steps", "x"])
    assert r.exit_code == 2 and "--step" in r.output


class FakeCall:
    """A `modal.FunctionCall` as far as pingctl uses one: `get` gives each outcome in turn (an
    exception is raised), `logs.stream()`/`logs.tail(n)` give log entries."""

    def __init__(self, *outcomes, lines=()):
        self.outcomes = list(outcomes)
        entries = [type("LogEntry", (), {"message": f"{line}\n"})() for line in lines]
        self.logs = type("Logs", (), {"stream": lambda _s: iter(entries), "tail": lambda _s, n=100: entries[-n:]})()

    def get(self, timeout=None):
        out = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(out, BaseException):
            raise out
        return out


def test_status_follow_and_pull_commands_on_a_modal_run(tiny_run, tmp_path, monkeypatch):
    """`pingctl train RUN --status/--follow` and `pingctl pull RUN` through the CLI, with the two
    objects that would reach Modal replaced at the boundary: the function call and the volume."""
    import modal
    import modal.exception as E

    from pingctl.executor.modal import run as modal_run

    vol = DirVolume(tmp_path / "vol")
    _volume_from_run(tiny_run, vol, "tiny-3")
    monkeypatch.setattr(modal_run, "ModalVolume", lambda name, create=False: vol)
    monkeypatch.setattr(P, "ModalVolume", lambda name, create=False: vol)  # `pingctl pull`'s own
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-1")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-2")
    run = tmp_path / "run"
    run.mkdir()
    write_remote(run, "modal", name="tiny-3", volume=vol.name, app="pingctl-train", call_id="fc-7",
                 local={"train_rows": "/rows/here", "eval_rows": None, "jax_cache_dir": str(tmp_path / "xla")})

    def calls(call):
        monkeypatch.setattr(modal.FunctionCall, "from_id", lambda cid, client=None: call)

    calls(FakeCall(TimeoutError(), lines=["completed step: 59", "saved checkpoint 59"]))
    r = runner.invoke(app, ["train", str(run), "--status", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["state"] == "running" and s["active"] and s["job_id"] == "fc-7"
    assert s["remote_checkpoints"] == [0, 59] and s["checkpoints"] == [] and s["last_step"] == 59
    assert s["log_tail"] == "completed step: 59\nsaved checkpoint 59" and s["next"] == f"pingctl pull {run.resolve()}"

    calls(FakeCall(E.FunctionTimeoutError("Function timed out after 86400 s")))
    s = json.loads(runner.invoke(app, ["train", str(run), "--status", "--json"]).stdout)
    assert s["state"] == "failed" and "train.modal.timeout_s" in s["reason"] and not s["ok"]

    calls(FakeCall(E.AuthError("token revoked")))
    r = runner.invoke(app, ["train", str(run), "--status"])
    assert r.exit_code == 1 and "Modal refused the token (token revoked)" in r.output

    # follow: the log while it runs, then the outcome, then the pull
    calls(FakeCall(TimeoutError(), {"ok": True, "error": None, "summary": {}}, lines=["step 1", "step 2"]))
    r = runner.invoke(app, ["train", str(run), "--follow", "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert f["ok"] and f["state"] == "succeeded" and f["checkpoints"] == [59] and "checkpoints here: 59" in f["pull"]
    assert "step 1" in r.stderr and is_run_dir(run) and run_config(run).train.train_rows == "/rows/here"

    calls(FakeCall({"ok": False, "error": "training failed (exit 1); last lines of train.log: ...", "summary": None}))
    r = runner.invoke(app, ["train", str(run), "--follow"])
    assert r.exit_code == 1 and "failed" in r.output

    r = runner.invoke(app, ["pull", str(run), "--steps", "all", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)
    assert p["pulled_checkpoints"] == [0] and p["checkpoints"] == [0, 59] and p["remote"] == "test-volume:/runs/tiny-3"


def test_submit_detach_resume_and_blocking_run_through_the_cli(tiny_run, synth_rows, tmp_path, monkeypatch):
    """`pingctl train ROWS --target modal`, with what would reach Modal replaced at the boundary
    (the volume, and the app whose spawned call "trains" by leaving the tiny run on the volume)."""
    import modal

    from pingctl.executor.modal import run as modal_run

    vol = DirVolume(tmp_path / "vol")
    monkeypatch.setattr(modal_run, "ModalVolume", lambda name, create=False: vol)
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-1")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-2")
    spawned = []
    outcome = {"now": [{"ok": True, "error": None, "summary": {"first_step_this_run": 0, "last_step": 59,
                                                                "final_loss": 1.5}}]}

    class App:
        app_id = "ap-1"

        def run(self, detach=False):
            return contextlib.nullcontext(self)

    class Function:
        def spawn(self, config):
            spawned.append(config)
            name = config["train"]["run_dir"].rsplit("/", 1)[1]
            if not (vol.root / S.run_path(name)).exists():
                _volume_from_run(tiny_run, vol, name)
            call = FakeCall(*outcome["now"])
            call.object_id = f"fc-{len(spawned)}"
            return call

    monkeypatch.setattr(modal_run, "build_app", lambda cfg, name: (App(), Function(), None, None))
    run = tmp_path / "runs" / "train"
    args = ["train", str(synth_rows / "rows"), "--run-dir", str(run), "--target", "modal", "--steps", "100",
            "--set", "loader.seq_len=256", "--set", "loader.batch_size=8", "--json"]

    r = runner.invoke(app, [*args, "--detach"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    name = S.default_name(run)
    rec = read_remote(run)
    assert rec["target"] == "modal" and rec["name"] == name and rec["call_id"] == "fc-1" and rec["detached"]
    assert "ak-1" not in json.dumps(rec) and "as-2" not in json.dumps(rec)
    assert rec["local"]["train_rows"] == str((synth_rows / "rows").resolve())
    assert res["upload"]["upload"] > 0 and (vol.root / S.rows_path(name, "train") / "manifest.json").is_file()
    assert spawned[0]["train"]["run_dir"] == f"/data/runs/{name}" and spawned[0]["train"]["hardware"] == "gpu"
    assert not is_run_dir(run)  # detached: nothing pulled yet

    # the same command while the call still runs is refused; once it ended, it resumes
    monkeypatch.setattr(modal.FunctionCall, "from_id", lambda cid, client=None: FakeCall(TimeoutError()))
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "still training on Modal (call fc-1)" in r.output
    outcome["now"] = [{"ok": True, "error": None, "summary": {"first_step_this_run": 60, "last_step": 99,
                                                              "final_loss": 1.2}}]
    monkeypatch.setattr(modal.FunctionCall, "from_id", lambda cid, client=None: FakeCall(outcome["now"][0]))
    r = runner.invoke(app, args)  # blocking: waits, then pulls
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["upload"]["upload"] == 0 and res["upload"]["resume_from"] == 59
    assert res["summary"]["final loss"] == 1.2 and is_run_dir(run) and checkpoint_steps(run) == [59]
    assert read_remote(run)["call_id"] == "fc-2" and not read_remote(run)["detached"]

    # a failed run: its log comes home, the error is the command's
    outcome["now"] = [{"ok": False, "error": "training failed (exit 1)", "summary": None}]
    r = runner.invoke(app, args[:-1])
    assert r.exit_code == 1 and "training on Modal failed: training failed (exit 1)" in r.output
    assert "its log:" in r.output

    # --fresh: the remote run and what pulls brought here go first
    outcome["now"] = [{"ok": True, "error": None, "summary": {}}]
    (vol.root / S.run_path(name) / "marker").write_text("old run")
    r = runner.invoke(app, [*args, "--fresh"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["upload"]["deleted"] == [f"/runs/{name}", f"/rows/{name}"] and "config.yaml" in res["upload"]["cleared_here"]
    assert not (vol.root / S.run_path(name) / "marker").exists() and checkpoint_steps(run) == [59]


def test_the_modal_volume_wrapper_speaks_the_sdk_s_shapes(tmp_path):
    """ModalVolume over an object with modal.Volume's methods as SDK 1.6 defines them: paths
    sent with a leading '/', FileEntry (built offline) read back relative to the volume's root,
    a missing path or file as nothing, Modal's exceptions as PingctlErrors."""
    import modal.exception as E
    from modal.types import FileEntry, FileEntryType

    from pingctl.executor.modal.volume import ModalVolume

    calls = []

    class SdkVolume:
        def listdir(self, path, *, recursive=False):
            calls.append(("listdir", path, recursive))
            if path == "/runs/missing":
                raise E.NotFoundError("No such file or directory")
            if path == "/locked":
                raise E.AuthError("Token missing")
            return [FileEntry(path="runs/a/config.yaml", type=FileEntryType.FILE, mtime=0, size=3),
                    FileEntry(path="runs/a/maxtext", type=FileEntryType.DIRECTORY, mtime=0, size=0)]

        def read_file(self, path):  # a generator, as the SDK's: a missing file raises when read
            calls.append(("read_file", path))
            if path.endswith("absent"):
                raise FileNotFoundError(path)
            yield b"ab"
            yield b"c"

        @contextlib.contextmanager
        def batch_upload(self, force=False):
            batch = type("Batch", (), {"put_file": lambda _s, local, remote: calls.append(("put", local, remote))})()
            yield batch
            calls.append(("committed", force))

        def remove_file(self, path, recursive=False):
            calls.append(("remove", path, recursive))
            if path.endswith("absent"):
                raise FileNotFoundError(path)

    v = ModalVolume.__new__(ModalVolume)
    v.name, v.vol = "vol", SdkVolume()
    assert v.listdir("runs/a/", recursive=True) == [Entry("runs/a/config.yaml", False, 3), Entry("runs/a/maxtext", True, 0)]
    assert calls[-1] == ("listdir", "/runs/a", True)
    assert v.listdir("runs/missing") == []
    with pytest.raises(PingctlError, match="Modal refused the token"):
        v.listdir("locked")
    assert v.read("/runs/a/config.yaml") == b"abc" and v.read("runs/absent") is None
    v.download("runs/a/config.yaml", tmp_path / "c")
    assert (tmp_path / "c").read_bytes() == b"abc"
    with pytest.raises(PingctlError, match="vol:/runs/absent went away"):
        v.download("runs/absent", tmp_path / "d")
    v.upload([(tmp_path / "c", "rows/x/train/manifest.json")])
    assert calls[-2:] == [("put", str(tmp_path / "c"), "/rows/x/train/manifest.json"), ("committed", True)]
    v.remove("runs/absent")
    v.remove("runs/a")
    assert calls[-1] == ("remove", "/runs/a", True)
