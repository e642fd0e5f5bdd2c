"""`pingctl build-rows --target ENGINE`: the build as a `FanoutStep`, N tasks, one per hash
partition of the probes (docs/rows.md, "Fanned out"); the driver (pingctl.executor.fanout) runs
what is not done on the engine and merges. What a task does, its checks and the merge:
pingctl.records.fanout.work."""

from __future__ import annotations

import time
from pathlib import Path

from pingctl.artifacts.records import BY
from pingctl.artifacts.table import refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import check_replaceable
from pingctl.errors import UsageError
from pingctl.fanout.step import FanoutStep
from pingctl.records.fanout.work import PART, make_plan, merge, read_task, task_states, work_dir

DEFAULT_TASKS = 8


class BuildRowsFanout(FanoutStep):
    command = "build-rows"
    task_module = "pingctl.records.fanout.task"
    task_ref = "pingctl.records.fanout.work:run_task"
    function = "build_rows_task"
    marker = PART

    @classmethod
    def plan(cls, inputs: list[str | Path], out: Path, *, tasks: int = DEFAULT_TASKS, by: str = "source",
             max_row_mb: float = 8.0, dst_max_row_mb: float | None = None, memory_limit: str = "4GB",
             config: dict | None = None, force: bool = False) -> "BuildRowsFanout":
        if by not in BY:
            raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
        if tasks < 1:
            raise UsageError(f"--tasks {tasks}: give at least 1")
        out = Path(out)
        refuse_whole_shard_output(inputs)
        files = resolve_inputs(inputs)
        check_replaceable(out, force, inputs=files)
        plan = make_plan(files, out, by, tasks, max_row_mb, dst_max_row_mb, memory_limit, config)
        return cls(plan, work_dir(out), out)

    def states(self) -> dict[int, str | None]:
        return task_states(self.work, self.plan)

    def why_not_done(self, index: int) -> str | None:
        return read_task(self.work, self.plan["tasks"][index], self.plan["options"]["by"])[1]

    def merge(self, started: float) -> dict:
        result = merge(self.work, self.out)
        result["elapsed_s"] = time.perf_counter() - started
        result["measurements_per_s"] = result["measurements"] / result["elapsed_s"]
        return result

    def remote_plan(self) -> dict:
        # the containers read the split from its uploaded copy; its mtime is the upload's: size only
        sources = [{**src, "read": f"inputs/{i:05d}-{Path(src['source']).name}", "mtime_ns": None}
                   for i, src in enumerate(self.plan["sources"])]
        return {**self.plan, "sources": sources}

    def uploads(self, todo: list[int]) -> list[tuple[Path, str]]:
        return [(Path(src["source"]), src["read"]) for src in self.remote_plan()["sources"]]  # every task reads all

    def describe(self, states: dict[int, str | None], todo: list[int]) -> dict:
        n = len(self.plan["tasks"])
        size = sum(src["bytes"] for src in self.plan["sources"])
        return {
            "out": self.plan["out"],
            "by": self.plan["options"]["by"],
            "files": len(self.plan["sources"]),
            "input_bytes": size,
            "bytes_to_run": size if todo else 0,
            "plan": [{"task": i, "partition": f"md5(probe key) % {n} == {i}",
                      "state": "done: kept" if why is None else f"to run ({why})"} for i, why in states.items()],
        }


def local_dry_run(inputs: list[str | Path], out: Path, by: str = "source", force: bool = False) -> dict:
    """What a local build-rows would do: the split's files and bytes; nothing is written."""
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    check_replaceable(Path(out), force, inputs=files)
    return {"target": "local", "dry_run": True, "out": str(out), "by": by, "tasks": 1, "files": len(files),
            "input_bytes": sum(f.stat().st_size for f in files),
            "plan": [{"task": 0, "partition": "every probe", "state": "to run"}],
            "files_written": "nothing (--dry-run)"}
