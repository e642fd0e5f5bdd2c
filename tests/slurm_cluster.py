"""A real single-node SLURM for the tests: slurmctld, slurmd and a munged of its own, started
in a temp directory from the Debian packages (installed with apt-get when missing and running
as root, as on a fresh CI machine).

Each cluster is private: its own munge key and socket, its own free ports, all state and logs
in its directory. So every pytest-xdist worker (and a second test session on the same
machine) can start one without coordinating; nothing outside the directory is touched, and
only the processes started here are stopped.

    c = start()                  # or the `slurm_cluster` fixture (tests/conftest.py)
    subprocess.run(["sbatch", ...], env=c.env)   # c.env = os.environ + SLURM_CONF
    c.stop()

Needs root (slurmd runs jobs as their user). Timings on a 2-core machine: node idle ~1.1 s
after start; a requeued job runs again ~6 s later (AuthInfo cred_expire=5 and a scheduler pass
every 1-2 s: with SLURM's defaults a requeue waits 2-3 minutes).
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "munged", "mungekey")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
PREFIX = "pingctl-slurm-"
# Set in CI: a cluster that cannot start fails the tests instead of skipping them.
REQUIRE = "PINGCTL_REQUIRE_SLURM"


class Unavailable(Exception):
    """This machine cannot run the cluster; the message says why (the tests' skip reason)."""


def _which(cmd: str) -> str | None:
    return shutil.which(cmd) or next((f"{d}/{cmd}" for d in SBIN if os.access(f"{d}/{cmd}", os.X_OK)), None)


def _missing() -> list[str]:
    return [c for c in COMMANDS if _which(c) is None]


def ensure_installed() -> None:
    """apt-get install the packages when a command is missing (root only); else Unavailable."""
    if not _missing():
        return
    if os.geteuid() != 0:
        raise Unavailable(f"SLURM is not installed ({', '.join(_missing())} missing) and installing it needs root: "
                          f"apt-get install {' '.join(PACKAGES)}")
    if _which("apt-get") is None:
        raise Unavailable(f"SLURM is not installed ({', '.join(_missing())} missing) and there is no apt-get")
    from filelock import FileLock

    with FileLock(os.path.join(tempfile.gettempdir(), PREFIX + "apt.lock")):  # one dpkg at a time
        if not _missing():
            return
        # policy-rc.d (exit 101) keeps the postinst scripts from starting system daemons
        policy = Path("/usr/sbin/policy-rc.d")
        ours = not policy.exists()
        if ours:
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
        try:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:  # a fresh machine may have no package lists yet
                subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True, timeout=900)
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        finally:
            if ours:
                policy.unlink(missing_ok=True)
    if r.returncode != 0 or _missing():
        raise Unavailable(f"apt-get install {' '.join(PACKAGES)} failed (exit {r.returncode}): "
                          f"{(r.stderr or r.stdout).strip()[-500:]}")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_us() -> None:
    """In the daemon, before exec: SIGTERM when the test process ends, however it ends."""
    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale() -> None:
    """Remove the directories of clusters whose test process is gone (their daemons died with
    it; any left are ours by their command line naming the directory)."""
    for d in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            info = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if _alive(info.get("owner", 0)):
            continue
        for pid in info.get("pids", []):
            try:
                if str(d) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class SlurmCluster:
    dir: Path
    env: dict[str, str]  # os.environ plus SLURM_CONF: what every client (sbatch, squeue, ...) needs
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def active(self, job: str) -> bool:
        """Whether the job is still pending, running or completing (squeue lists it)."""
        return bool(self.run("squeue", "-h", "-j", job, check=False).stdout.strip())

    def wait_gone(self, job: str, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while self.active(job):
            if time.time() > deadline:
                raise AssertionError(f"job {job} still active after {timeout} s:\n{self.logs()}")
            time.sleep(0.2)

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "-o", "show", "job", job).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def array_runs(self, job: str) -> dict[int, tuple[float, float]]:
        """Array task id -> (start, end) in seconds since the epoch of each task of job array `job`
        that ended, as the controller recorded them in its job completion log (what `sacct -c`
        reads): whole seconds, and independent of anything pingctl writes."""
        runs = {}
        for line in (self.dir / "log" / "jobcomp.txt").read_text().splitlines():
            f = dict(re.findall(r"(\w+)=(\S*)", line))
            if f.get("ArrayJobId") == job:  # a requeued task's later record replaces its earlier one
                runs[int(f["ArrayTaskId"])] = (datetime.fromisoformat(f["StartTime"]).timestamp(),
                                               datetime.fromisoformat(f["EndTime"]).timestamp())
        return runs

    def assert_ran_at_once(self, job: str, manifests: dict[int, Path]) -> dict[str, list]:
        """Assert that two tasks of job array `job` ran at the same time by SLURM's record, and that
        two did their work at the same time by their own: `manifests` maps a task to the manifest
        it wrote last (task.json, part.json), whose `elapsed_s` is how long its work took, so the
        work ran from the file's mtime less those seconds to its mtime. Both overlaps, longest first."""
        runs = {i: r for i, r in self.array_runs(job).items() if i in manifests}
        work = {i: (f.stat().st_mtime - json.loads(f.read_text())["elapsed_s"], f.stat().st_mtime)
                for i, f in manifests.items()}
        found = {"slurm": overlapping(runs), "work": overlapping(work, stamped=False)}
        assert found["slurm"], f"no two tasks of job {job} ran at once by SLURM's record: {runs}"
        assert found["work"], f"no two tasks of job {job} worked at once (start, end of their work): {work}"
        return found

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n" + f.read_text(errors="replace")[-2000:]
                         for f in sorted((self.dir / "log").glob("*.log")))

    def stop(self) -> None:
        """Cancel what still runs, then stop this cluster's daemons (only those)."""
        if self.procs and all(p.poll() is None for p in self.procs):
            jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                deadline = time.time() + 20
                while self.run("squeue", "-h", check=False).stdout.strip() and time.time() < deadline:
                    time.sleep(0.2)
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def overlapping(runs: dict[int, tuple[float, float]], stamped: bool = True) -> list[tuple[int, int, float]]:
    """(task, task, seconds) for every two runs (start, end) that certainly ran at the same time,
    longest first; the seconds are a lower bound on how long. SLURM stamps whole seconds,
    truncated (`stamped`): a start stamped at least a second before the other's end stamp began
    before that end, and the two shared more than (end stamp - start stamp - 1) s."""
    pairs = []
    for a, (s1, e1) in runs.items():
        for b, (s2, e2) in runs.items():
            both = min(e1, e2) - max(s1, s2)
            if a < b and (both >= 1 if stamped else both > 0):
                pairs.append((a, b, both - 1 if stamped else both))
    return sorted(pairs, key=lambda p: -p[2])


CONF = """\
ClusterName=pingctltest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket,cred_expire=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.txt
MinJobAge=300
SchedulerParameters=bf_interval=1,sched_interval=2
KillWait=5
{slurmd_parameters}
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


# The fan-out tests assert that two array tasks ran at once: a node needs two schedulable cores.
MIN_CPUS = 2


def _node_line() -> tuple[str, str]:
    """`slurmd -C`'s line (exact socket/core layout) with memory below what it detects, or the
    node is drained. On a machine of one CPU, or of hyperthreads (with CR_Core a task holds a
    whole core, so two hyperthreads run one task), the node is declared as one core a CPU and
    at least MIN_CPUS of them; SLURM then takes the declared layout (SlurmdParameters=
    config_overrides), and with task/none nothing is pinned, so tasks share the real CPUs.
    Returns the node line and that parameter line (empty where the detected layout is kept)."""
    line = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    words, f = [], dict(w.split("=", 1) for w in line.split() if "=" in w)
    cpus = int(f.get("CPUs", 1))
    flat = cpus < MIN_CPUS or f.get("ThreadsPerCore", "1") != "1"
    for w in line.split():
        if w.startswith("RealMemory="):
            w = f"RealMemory={max(256, int(w.split('=')[1]) - 512)}"
        elif flat and w.split("=")[0] in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore"):
            continue
        words.append(w)
    if flat:
        n = max(cpus, MIN_CPUS)
        words[1:1] = [f"CPUs={n}", "Boards=1", "SocketsPerBoard=1", f"CoresPerSocket={n}", "ThreadsPerCore=1"]
    return " ".join(words), "SlurmdParameters=config_overrides" if flat else ""


def start(timeout: float = 60) -> SlurmCluster:
    """Install if needed, then start a private cluster; Unavailable (with the reason) if it cannot."""
    ensure_installed()
    if os.geteuid() != 0:
        raise Unavailable("a SLURM node (slurmd) needs root to run jobs; run the tests as root")
    _sweep_stale()
    d = Path(tempfile.mkdtemp(prefix=PREFIX))
    d.chmod(0o755)  # munged runs as `munge` and must reach its directory
    for sub in ("state", "spool", "log", "munge"):
        (d / sub).mkdir()
    shutil.chown(d / "munge", "munge", "munge")
    (d / "munge").chmod(0o711)  # munged refuses a socket directory others cannot traverse
    ctld_port, slurmd_port = _free_ports(2)
    node, params = _node_line()
    (d / "slurm.conf").write_text(CONF.format(host=socket.gethostname().split(".")[0], ctld_port=ctld_port,
                                              slurmd_port=slurmd_port, d=d, node=node, slurmd_parameters=params))
    c = SlurmCluster(dir=d, env={**os.environ, "SLURM_CONF": str(d / "slurm.conf")})
    owner = {"owner": os.getpid(), "pids": []}
    try:
        m = d / "munge"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={m}/munge.key"], user="munge",
                       capture_output=True, text=True, check=True)
        c.procs.append(subprocess.Popen(
            [_which("munged"), "-F", f"--socket={m}/munge.socket", f"--key-file={m}/munge.key",
             f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"],
            user="munge", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_us))
        _wait(lambda: (m / "munge.socket").exists(), 10, c, "munged never opened its socket")
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            c.procs.append(subprocess.Popen(
                [_which(daemon[0]), *daemon[1:], "-f", str(c.conf)], env=c.env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_us))
        owner["pids"] = [p.pid for p in c.procs]
        (d / "owner.json").write_text(json.dumps(owner))
        _wait(lambda: c.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip() == "idle", timeout, c,
              "the node never became idle")
    except BaseException as e:
        logs = c.logs()
        c.stop()
        if isinstance(e, KeyboardInterrupt):
            raise
        raise Unavailable(f"SLURM did not start: {e}\n{logs}") from e
    return c


def _wait(ok, timeout: float, c: SlurmCluster, what: str) -> None:
    deadline = time.time() + timeout
    while not ok():
        dead = [p.args[0] for p in c.procs if p.poll() is not None]
        if dead or time.time() > deadline:
            raise Unavailable(f"{what}" + (f" ({', '.join(map(str, dead))} exited)" if dead else f" in {timeout} s"))
        time.sleep(0.1)
