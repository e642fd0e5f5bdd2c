"""The Hugging Face Hub round trip: `pingctl export --push-to-hub`, then the model loaded by its repo
id (`Model.load`, and every command that takes a model), against tests/hub_standin.py, a local
stand-in for the Hub's HTTP API on 127.0.0.1. huggingface_hub itself does the talking (it is
pointed there by HF_ENDPOINT): the stand-in replaces the Hub at that boundary only.

The model is the hinted run of tests/test_hints.py: an export holding every kind of file
(hints.npz included), whose answers read its hints file."""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pingctl.artifacts import export as EX
from pingctl.cli.app import app
from pingctl.errors import PingctlError
from tests.hub_standin import HubStandIn
from tests.test_export import assert_shareable
from tests.test_hints import hinted_run, tri_run  # noqa: F401 - fixtures

pytest.importorskip("huggingface_hub")

TOKEN = "hf_standin_0123456789_token"
REPO = "acme/hinted-rtt"
runner = CliRunner()


@pytest.fixture(scope="module")
def hub():
    with HubStandIn(token=TOKEN) as h:
        yield h


def hub_env(hub: HubStandIn, home: Path, token: str | None = TOKEN) -> dict:
    """A process's environment for the stand-in: its endpoint, a Hub cache of its own, a token or none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HUB_DISABLE_TELEMETRY="1")
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def use_hub(monkeypatch, hub: HubStandIn, home: Path, token: str | None = TOKEN) -> None:
    """The same for this process (pingctl reads the variables at each call)."""
    for k in [k for k in os.environ if k.startswith(("HF_", "HUGGING_FACE"))]:
        monkeypatch.delenv(k)
    for k, v in hub_env(hub, home, token).items():
        if k.startswith("HF_"):
            monkeypatch.setenv(k, v)


def pingctl(*args, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "pingctl", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=900)
    if ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def pushed(hub, hinted_run, tmp_path_factory):  # noqa: F811 - the imported fixture
    """The hinted run exported and pushed by one `pingctl export --push-to-hub` process:
    (export directory, its --json result, the process)."""
    root = tmp_path_factory.mktemp("hub")
    out = root / "hinted"
    proc = pingctl("export", hinted_run, "-o", out, "--push-to-hub", REPO, "--json", env=hub_env(hub, root / "pusher"))
    return out, json.loads(proc.stdout), proc


@pytest.fixture(scope="module")
def question(time_split):
    """A question a hinted model answers with its hint: a pair of the test split, its time, and
    `both` context from the train split."""
    row = pq.read_table(time_split / "test").slice(0, 1).to_pylist()[0]
    return ["--src", row["src_addr"], "--dst", row["dst_addr"], "--time", int(row["event_time"].timestamp()),
            "--context", time_split / "train", "--context-policy", "both", "--context-k", 5, "--json"]


def test_a_push_uploads_the_export_as_it_is(pushed, hub, hinted_run):  # noqa: F811
    out, result, proc = pushed
    held = {f["name"] for f in EX.files(out)}
    assert EX.HINTS in held and result["files"] == EX.files(out)
    on_hub = hub.files(REPO)
    # the export's files, byte for byte, beside what the Hub made the repo with
    assert set(on_hub) - {".gitattributes"} == held
    assert all(on_hub[n] == (out / n).read_bytes() for n in held)
    assert result["hub"] == {"repo": REPO, "revision": "main", "commit": hub.repos[REPO].branches["main"],
                             "url": f"{hub.url}/{REPO}/commit/{hub.repos[REPO].branches['main']}"}
    assert not hub.repos[REPO].private
    # the token went to the Hub (a write without it is refused) and nowhere else
    assert TOKEN not in proc.stdout + proc.stderr
    # the card names the model by its repo, and says how to load it from there
    card = (out / EX.CARD).read_text()
    assert f'Model.load("{REPO}")' in card and f"pingctl sample {REPO} --src" in card
    assert_shareable(out, hinted_run, hinted_run.parent, out.parent)


def test_a_download_is_the_exports_file_list(pushed, hub, tmp_path, monkeypatch):
    """Whatever an export holds comes back: the download allow-list is the layout's own list."""
    from pingctl.artifacts.hub import hub_name, resolve_model_path

    out = pushed[0]
    use_hub(monkeypatch, hub, tmp_path / "home", token=None)  # a public repo: no token needed
    got = resolve_model_path(REPO)
    assert got.is_relative_to(tmp_path / "home" / "hub")
    assert sorted(p.name for p in got.iterdir()) == sorted(f["name"] for f in EX.files(out))
    assert all((got / p.name).read_bytes() == (out / p.name).read_bytes() for p in got.iterdir())
    assert hub_name(got) == f"{REPO}@{hub.repos[REPO].branches['main']}"


def test_a_model_from_the_hub_answers_as_its_directory(pushed, hub, question, tmp_path, monkeypatch):
    """`pingctl sample REPO` in a fresh process and cache, and `Model.load(REPO, revision=...)`,
    answer as the export directory does: the hinted prompt included, which reads hints.npz."""
    from pingctl import Model

    out = pushed[0]
    env = hub_env(hub, tmp_path / "home", token=None)
    from_hub = json.loads(pingctl("sample", REPO, *question, env=env).stdout)
    from_dir = json.loads(pingctl("sample", out, *question, env=env).stdout)
    assert from_hub["hint_ms"] is not None
    assert Path(from_hub.pop("run")).is_relative_to(tmp_path / "home") and from_dir.pop("run") == str(out.resolve())
    assert from_hub == from_dir
    commit = hub.repos[REPO].branches["main"]
    use_hub(monkeypatch, hub, tmp_path / "api", token=None)
    m, d = Model.load(REPO, revision=commit), Model.load(out)
    assert m.name == f"{REPO}@{commit}" and m.steps == d.steps
    a, b = m.rtt(*question[1:4:2]), d.rtt(*question[1:4:2])
    assert a.p_fail == b.p_fail and a.quantiles == b.quantiles


def test_a_push_needs_a_token_and_one_the_hub_takes(hinted_run, hub, tmp_path):  # noqa: F811
    # no token at all: said before anything is exported
    proc = pingctl("export", hinted_run, "-o", tmp_path / "a", "--push-to-hub", "acme/other", env=hub_env(
        hub, tmp_path / "h", token=None), ok=False)
    assert proc.returncode == 2 and "needs a Hugging Face token" in proc.stderr and not (tmp_path / "a").exists()
    # a token the Hub refuses: the export is written, the push named as failed, the token not shown
    wrong = "hf_wrong_token_42"
    proc = pingctl("export", hinted_run, "-o", tmp_path / "b", "--push-to-hub", "acme/other", "--json",
                   env=hub_env(hub, tmp_path / "h", token=wrong), ok=False)
    err = json.loads(proc.stdout)["error"]
    assert proc.returncode == 1 and err["kind"] == "input" and "acme/other" not in hub.repos
    assert "--push-to-hub acme/other: the upload failed: the Hub refused the token" in err["message"]
    assert wrong not in proc.stdout + proc.stderr and EX.is_export_dir(tmp_path / "b")
    proc = pingctl("export", hinted_run, "-o", tmp_path / "c", "--private", env=hub_env(hub, tmp_path / "h"), ok=False)
    assert proc.returncode == 2 and "options of --push-to-hub" in proc.stderr


def test_a_private_branch_push_loads_with_its_revision(hinted_run, hub, tmp_path, monkeypatch):  # noqa: F811
    repo = "acme/private-rtt"
    result = json.loads(pingctl("export", hinted_run, "-o", tmp_path / "ex", "--push-to-hub", repo, "--private",
                                "--revision", "dev", "--json", env=hub_env(hub, tmp_path / "h")).stdout)
    r = hub.repos[repo]
    assert r.private and result["hub"]["revision"] == "dev" and result["hub"]["commit"] == r.branches["dev"]
    assert set(r.commits[r.branches["main"]]) == {".gitattributes"}  # main as the Hub created it
    from pingctl import Model

    use_hub(monkeypatch, hub, tmp_path / "reader")
    assert Model.load(repo, revision="dev").name == f"{repo}@{r.branches['dev']}"
    with pytest.raises(PingctlError, match=f"{repo}: the Hugging Face Hub repo holds no `pingctl export` model"):
        Model.load(repo)
    use_hub(monkeypatch, hub, tmp_path / "stranger", token=None)
    with pytest.raises(PingctlError, match="no such model repo \\(or a private one the token does not reach\\)"):
        Model.load(repo, revision="dev")


@pytest.mark.parametrize("command", ["sample", "score", "eval", "inspect", "serve"])
def test_every_command_that_takes_a_model_takes_a_repo_id(command, hub, tmp_path, monkeypatch):
    """Each resolves its model argument through the Hub: a repo the Hub does not have is named as
    such (it was once a directory that does not exist, or a run directory it is not)."""
    from tests.conftest import make_table

    table = tmp_path / "t.parquet"
    pq.write_table(make_table(50), table)
    args = {"sample": ["--src", "8.8.8.8", "--dst", "1.1.1.1"], "score": [table, "-o", tmp_path / "s.parquet"],
            "eval": ["--train", table, "--test", table, "-o", tmp_path / "ev"], "inspect": [],
            "serve": ["--port", "0"]}[command]
    use_hub(monkeypatch, hub, tmp_path / "home")
    r = runner.invoke(app, [command, "acme/absent", *map(str, args), "--revision", "v1", "--json"])
    err = json.loads(r.stdout)["error"]
    assert r.exit_code == 1, r.output
    assert err["message"].startswith("acme/absent: no such directory, and not loadable as a Hugging Face Hub repo "
                                     "at revision v1: no such model repo"), err


def test_inspect_and_revision_of_a_directory(pushed, hub, tmp_path, monkeypatch):
    use_hub(monkeypatch, hub, tmp_path / "home", token=None)
    r = runner.invoke(app, ["inspect", REPO, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "export" and d["source_run"] == "hinted/run"  # the run's last two parts, no path
    r = runner.invoke(app, ["inspect", str(pushed[0]), "--revision", "main"])
    assert r.exit_code == 2 and "a revision picks a version of a Hugging Face Hub repo" in r.output


def test_serve_by_repo_id_names_the_model_without_a_path(pushed, hub, tmp_path):
    """/version and /health once gave the model's absolute path (here: inside the Hub cache of
    the serving machine's home); they name the repo and commit now."""
    env = hub_env(hub, tmp_path / "home", token=None)
    proc = subprocess.Popen([sys.executable, "-m", "pingctl", "serve", REPO, "--port", "0", "--json", "--no-warmup"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        while not lines or not lines[-1].startswith("}"):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            lines.append(line)
        port = int(json.loads("".join(lines))["url"].rsplit(":", 1)[1])
        got = {}
        for route in ("/version", "/health"):
            deadline = time.monotonic() + 60
            while route not in got:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                    conn.request("GET", route)
                    got[route] = conn.getresponse().read().decode()
                    conn.close()
                except ConnectionRefusedError:  # uvicorn starts a moment after the line is printed
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        want = f"{REPO}@{hub.repos[REPO].branches['main']}"
        for route, text in got.items():
            assert json.loads(text)["run"] == want, text
            assert str(tmp_path) not in text and str(Path.home()) + "/" not in text, text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
