"""`pingctl ingest --target ENGINE`: the ingest as a `FanoutStep`, one task per input file, in
input order; the driver (pingctl.executor.fanout) runs what is not done on the engine and merges.
What a task does, its checks and the merge: `work`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from pingctl.atomic import check_replaceable
from pingctl.errors import UsageError
from pingctl.fanout.step import FanoutStep
from pingctl.ingest.core import is_stream, resolve
from pingctl.ingest.fanout.work import TASK_MANIFEST, make_plan, merge, read_task, task_states, work_dir
from pingctl.ingest.parse import Options
from pingctl.ingest.reader import usable_cores


class IngestFanout(FanoutStep):
    command = "ingest"
    task_module = "pingctl.ingest.fanout.task"
    task_ref = "pingctl.ingest.fanout.work:run_task"
    function = "ingest_task"
    marker = TASK_MANIFEST

    @classmethod
    def plan(cls, inputs: Iterable[str | Path], out: Path, cfg, force: bool = False, engine: str = "slurm"):
        """The step for `inputs` -> `out`: refused for a pipe (each input is read by its own task
        elsewhere) and for an output that is not replaceable."""
        out = Path(out)
        files = resolve(inputs, out)
        streams = [f for f in files if is_stream(f)]
        if streams:
            raise UsageError(f"{streams[0]} is a pipe or device: with --target {engine} each input is read by its own "
                             "task elsewhere, and a stream can only be read here; save it to a file first")
        check_replaceable(out, force)
        return cls(make_plan(files, out, cfg, Options.from_config(cfg)), work_dir(out), out)

    def states(self) -> dict[int, str | None]:
        return task_states(self.work, self.plan)

    def why_not_done(self, index: int) -> str | None:
        return read_task(self.work, self.plan["tasks"][index])[1]

    def label(self, index: int) -> str:
        return f"task {index} ({self.plan['tasks'][index]['path']})"

    def merge(self, started: float) -> dict:
        return merge(self.work, self.out, elapsed_from=started)

    def remote_plan(self) -> dict:
        # a copy on a volume has the upload's mtime: only its size is checked
        tasks = [{**t, "read": f"inputs/{t['index']:05d}-{Path(t['source']).name}", "mtime_ns": None}
                 for t in self.plan["tasks"]]
        return {**self.plan, "tasks": tasks}

    def uploads(self, todo: list[int]) -> list[tuple[Path, str]]:
        tasks = self.remote_plan()["tasks"]
        return [(Path(tasks[i]["source"]), tasks[i]["read"]) for i in todo]

    def describe(self, states: dict[int, str | None], todo: list[int]) -> dict:
        tasks = self.plan["tasks"]
        return {
            "out": self.plan["out"],
            "files": len(tasks),
            "input_bytes": sum(t["bytes"] for t in tasks),
            "bytes_to_run": sum(tasks[i]["bytes"] for i in todo),
            "plan": [{"task": t["index"], "path": t["path"], "bytes": t["bytes"],
                      "state": "done: kept" if states[t["index"]] is None else f"to run ({states[t['index']]})"}
                     for t in tasks],
        }


def local_dry_run(inputs: Iterable[str | Path], out: Path, cfg, force: bool = False) -> dict:
    """What `--target local` would do: the files in input order (part numbers), their bytes and
    the worker processes; nothing is read but the file sizes, nothing is written."""
    out = Path(out)
    files = resolve(inputs, out)
    check_replaceable(out, force)
    streams = any(is_stream(f) for f in files)
    sizes = [None if is_stream(f) else f.stat().st_size for f in files]
    return {
        "target": "local",
        "dry_run": True,
        "out": str(out),
        "files": len(files),
        "input_bytes": None if streams else sum(sizes),
        "workers": 1 if streams else min(cfg.workers or usable_cores(), len(files)),
        "plan": [{"task": i, "path": str(f), "bytes": b, "state": "to run"} for i, (f, b) in enumerate(zip(files, sizes))],
        "files_written": "nothing (--dry-run)",
    }
