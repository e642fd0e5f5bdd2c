"""The one typed config shared by every subcommand.

Resolution order (later wins): model defaults < YAML file (`--config`) < `--set key=value`
overrides < explicit command-line options of the subcommand.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pingctl.errors import ConfigError, PingctlError
from pingctl.schema.times import parse_when


class Section(BaseModel):
    # no inf/NaN anywhere: `--max-row-mb inf` reached the writer as a NaN record size
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v, info):
        # pydantic reads true as 1: YAML's `seed: on` or `--set eval.seed=yes` became seed 1
        if isinstance(v, bool):
            ann = cls.model_fields[info.field_name].annotation
            if ann is not bool and bool not in typing.get_args(ann) and ann is not typing.Any:
                raise ValueError("a boolean (true/false, yes/no, on/off) where a number or text is expected")
        return v


_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(b|bytes?|[kmgt]i?b)?\s*", re.I)


def check_memory_limit(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):  # YAML made `4096` a number: bytes? MB?
        raise ValueError(f"a DuckDB memory limit needs a unit: {v}MB or {v}GB, say")
    m = _MEMORY.fullmatch(str(v))
    if not m or float(m.group(1)) <= 0:
        raise ValueError("a DuckDB memory limit is a size like 4GB, 512MB or 2GiB, above 0")
    return v


def _iso_time(v):
    if isinstance(v, (dt.date, dt.datetime)):  # YAML reads 2024-02-01T00:00:00 as a datetime
        v = v.isoformat()
    try:
        dt.datetime.fromisoformat(str(v).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("not an ISO 8601 time like 2024-01-01T00:00:00Z") from None
    return v


class IngestConfig(Section):
    src_field: Literal["auto", "from", "src_addr"] = Field(
        "auto", description="source address: auto = public `from` when src_addr is private/missing"
    )
    af: Literal[0, 4, 6] = Field(0, description="keep only this address family (0 = both)")
    msm_ids: list[int] = Field(default_factory=list, description="keep only these measurement ids (empty = all)")
    probe_ids: list[int] = Field(default_factory=list, description="keep only these probe ids (empty = all)")
    since: str | None = Field(None, description="keep results at/after this UTC time (ISO 8601 or Unix seconds)")
    until: str | None = Field(None, description="keep results before this UTC time (ISO 8601 or Unix seconds)")

    @field_validator("since", "until", mode="before")
    @classmethod
    def _time_as_text(cls, v):
        # YAML turns 2024-01-01 into a date and 1700000000 into an int; ingest parses text.
        if isinstance(v, (dt.date, dt.datetime)):
            return v.isoformat()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        return v

    @field_validator("since", "until")
    @classmethod
    def _time_parses(cls, v):
        # checked here so `config check` catches what ingest would refuse at run time
        if v is not None:
            try:
                parse_when(v, "time")
            except PingctlError as e:
                raise ValueError(str(e).split(": ", 1)[-1]) from None  # the field and value are named around it
        return v

    @model_validator(mode="after")
    def _since_before_until(self):
        since, until = parse_when(self.since, "since"), parse_when(self.until, "until")
        if since is not None and until is not None and since >= until:
            raise ValueError(f"since ({self.since}) must be before until ({self.until})")
        return self

    sample: float = Field(1.0, gt=0.0, le=1.0, description="deterministic fraction of results to keep")
    drop_dups: bool = Field(False, description="drop duplicate replies (\"dup\": 1) instead of keeping them")
    workers: int = Field(0, ge=0, description="parallel file workers (0 = one per core)")
    row_group_rows: int = Field(262_144, ge=1024, description="Parquet row-group size (DuckDB parallelises per group)")


class SynthConfig(Section):
    seed: int = Field(0, ge=0, description="world and measurement seed; same seed = identical output")
    rows: int = Field(1_000_000, gt=0, description="approximate number of rows (packets) to generate")
    probes: int = Field(200, gt=0, description="number of vantage points")
    targets: int = Field(40, gt=0, description="number of destinations")
    targets_per_probe: int = Field(12, gt=0, description="destinations each probe measures")
    step: int = Field(240, gt=0, description="seconds between measurement rounds of one probe-target pair")
    packets: int = Field(3, ge=1, le=16, description="packets per result")
    dual_stack_share: float = Field(0.4, ge=0.0, le=1.0, description="share of hosts that also have IPv6")
    start: str = Field("2024-01-01T00:00:00Z", description="UTC start time of the generated series")
    addresses: Literal["structured", "random"] = Field(
        "structured", description="structured: prefixes follow region, AS and city; random: unrelated to "
        "place, AS or prefix (only measurements tell where a host is)"
    )

    _start = field_validator("start", mode="before")(_iso_time)


class RegimesConfig(Section):
    """`--strategy regimes`: what each test set holds out (docs/data.md)."""

    time: float = Field(0.1, ge=0.0, lt=1.0,
                        description="last share (by time) of the rows between kept sources and destinations: test_time")
    pair: float = Field(0.05, ge=0.0, lt=1.0, description="share of the pairs between kept sources and destinations: test_pair")
    probe: float = Field(0.05, ge=0.0, lt=1.0, description="share of sources (probe ids and addresses): test_probe")
    target: float = Field(0.05, ge=0.0, lt=1.0, description="share of destination addresses: test_target")
    val: float = Field(0.5, ge=0.0, le=1.0,
                       description="val_pair, val_probe, val_target each hold out this many groups per group of "
                       "their regime's test set (0 = none: eval --regimes then fits on val, time-regime data)")


class ShardConfig(Section):
    strategy: Literal["time", "probe", "target", "pair", "random", "regimes"] = Field(
        "time", description="time: last fraction is test; probe/target/pair: held-out groups; random: per row; "
        "regimes: train/val and one test set per regime (time, pair, probe, target)"
    )
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of rows (or groups) for validation")
    test_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of rows (or groups) for test")
    regimes: RegimesConfig = RegimesConfig()
    seed: int = Field(0, ge=0, description="seed of the hash that assigns groups/rows to splits")
    rows_per_shard: int = Field(2_000_000, ge=1000, description="target rows per output Parquet shard")
    memory_limit: str = Field("8GB", description="DuckDB memory limit; larger inputs spill to disk")

    _memory = field_validator("memory_limit", mode="before")(check_memory_limit)
    threads: int = Field(0, ge=0, description="DuckDB threads (0 = all cores)")

    @model_validator(mode="after")
    def _train_keeps_rows(self):
        # checked here, not in shard, so `config check` and --set refuse it with exit 2
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, leaving rows for train "
                             f"(got {self.val_fraction} + {self.test_fraction})")
        if self.strategy == "regimes" and self.val_fraction + self.regimes.time >= 1.0:
            raise ValueError(f"val_fraction + regimes.time must be < 1, leaving rows for train "
                             f"(got {self.val_fraction} + {self.regimes.time})")
        return self


class DataConfig(Section):
    ingest: IngestConfig = IngestConfig()
    synth: SynthConfig = SynthConfig()
    shard: ShardConfig = ShardConfig()


class TokenizerConfig(Section):
    scheme: Literal["compact", "full"] = Field("compact", description="measurement language (see docs/tokenizer.md)")


class RowsConfig(Section):
    max_row_mb: float = Field(8.0, gt=0, description="split a probe's history into records of at most this size")
    dst_max_row_mb: float = Field(
        1.0, gt=0, description="the same for destination records (--by destination|both): the loader reads one "
        "per triangulation context, so small ones cost less")
    memory_limit: str = Field("2GB", description="DuckDB memory limit for grouping and sorting (peak RSS stays below ~2x)")

    _memory = field_validator("memory_limit", mode="before")(check_memory_limit)


class LoaderConfig(Section):
    seq_len: int = Field(1024, ge=32, description="packed sequence length (max_target_length)")
    batch_size: int = Field(8, ge=1, description="sequences per batch")
    contexts_per_record: int = Field(
        2, ge=1, description="rows drawn per record per epoch, at least (long records get ~1 per seq_len tokens)"
    )
    mode_weights: tuple[float, float, float] = Field(
        (0.4, 0.3, 0.3), description="timestamp modes full / partial / none"
    )
    workers: int = Field(-1, ge=-1, description="Grain worker processes (-1 = automatic: 0 on <= 2 cores)")
    seed: int = Field(0, ge=0, description="shuffle and augmentation seed")
    eval_seed: int = Field(1234, ge=0, description="fixed seed of the deterministic (shuffled) eval iterator")
    read_threads: int = Field(
        -1, ge=-1,
        description="Grain read threads per process (-1 = automatic: 0; JAX's asynchronous dispatch already overlaps "
                    "batch making with the step, and a thread only adds GIL handoffs; >1 only adds GIL contention)",
    )
    read_prefetch: int = Field(4, ge=0, description="elements prefetched per process by its read threads (none without them)")
    shuffle_window: int = Field(1024, ge=1, description="rows mixed by the window shuffle (rows of many probes per batch)")
    rows_per_element: int = Field(
        4, ge=1, le=64,
        description="rows packed per record read; small keeps batches mixed (a window holds shuffle_window / this records)",
    )
    loss_keep: dict[str, float] = Field(
        {},
        description="training loss only: share of each field's target tokens kept in the loss, drawn afresh "
        "per token (fields: the scheme's blocks, e.g. src dst result time, and `structure`; missing = 1)",
    )
    result_last: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of measurements whose RTT block is placed last (the rest: uniform random order); "
        "more RTT targets given both addresses, fewer inverse (RTT -> address) ones",
    )
    max_per_pair: int = Field(
        0, ge=0, description="at most this many measurements of one (src, dst) pair per context (0 = no cap)"
    )
    triangulation_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of rows packed with triangulation contexts (a query's source side, its destination "
        "side, the query last; needs rows built with `build-rows --by both`), drawn per element: all of its "
        "rows or none; the rest as before",
    )
    triangulation_k_src: int = Field(
        16, ge=0, le=1024, description="triangulation contexts: at most this many measurements of the query's "
        "probe to other destinations")
    triangulation_k_dst: int = Field(
        16, ge=0, le=1024, description="triangulation contexts: at most this many measurements of the query's "
        "destination from other sources")
    triangulation_per_pair: int = Field(
        1, ge=0, description="triangulation contexts: at most this many measurements of one pair per side, the "
        "most recent (0 = no cap)")
    hints_file: str | None = Field(
        None, description="triangulation contexts: a hints file (`pingctl hints`): the least-squares embedding's "
        "cross-fitted RTT estimate for the query pair, given as a measurement of the pair without a timestamp just "
        "before the query (docs/loader.md, \"Hints\"); answers then carry the estimate fitted on all of train")
    hint_share: float = Field(
        0.5, ge=0.0, le=1.0, description="share of triangulation contexts given a hint (with loader.hints_file); "
        "the rest are trained without, as prompts without an estimate are asked")
    relative_target: bool = Field(
        False, description="hinted triangulation contexts (needs loader.hints_file): the query's RTT as a ratio to "
        "the hint's, rtt * 100 / hint ms through the same codec, so the model learns the correction to the estimate; "
        "answers multiply back (docs/loader.md, \"Hints\"); prompts without a hint stay absolute")
    pair_history_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="share of plain contexts that are one pair's history instead of a window of the probe: the "
        "pair's last pair_history_k measurements before a query of it, the query last (no max_per_pair cap), "
        "the shape of eval's `pair` prompts")
    pair_history_k: int = Field(
        16, ge=1, le=1024, description="pair-history contexts: at most this many of the pair's earlier measurements")
    debug: bool = Field(False, description="Grain debug mode: periodic per-stage execution summaries in the log")
    visualize: bool = Field(False, description="log Grain's pipeline graph once, with each stage's output spec")
    visualize_dir: str | None = Field(
        None, description="unsupported: Grain cannot write the graph to a file; use visualize (kept for old configs)")

    @field_validator("visualize_dir")
    @classmethod
    def _no_graph_file(cls, v: str | None) -> str | None:
        if v:  # Grain 0.2.18 raises NotImplementedError at the first batch: refuse it before a run starts
            raise ValueError("Grain cannot write the pipeline graph to a file; set loader.visualize=true to have it "
                             "logged (a training run's train.log)")
        return v

    @field_validator("loss_keep")
    @classmethod
    def _keep_range(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if not 0.0 <= x <= 1.0}
        if bad:
            raise ValueError(f"loss_keep shares must lie in [0, 1], got {bad}")
        return v

    @field_validator("mode_weights")
    @classmethod
    def _weights(cls, v):
        if any(w < 0 for w in v) or sum(v) <= 0:
            raise ValueError("weights must be non-negative and not all zero")
        return v

    @model_validator(mode="after")
    def _hints_need_triangulation(self):
        if self.hints_file and self.triangulation_share <= 0:
            raise ValueError("loader.hints_file puts the embedding's estimate into triangulation contexts, which "
                             "loader.triangulation_share 0 leaves out: set it above 0 (e.g. 0.5)")
        return self

    @model_validator(mode="after")
    def _relative_needs_hints(self):
        if self.relative_target and not self.hints_file:
            raise ValueError("loader.relative_target makes a hinted query's RTT relative to its hint, and "
                             "loader.hints_file is unset, so no context has one: set a hints file or leave it off")
        return self

    @model_validator(mode="after")
    def _triangulation_has_a_side(self):
        if self.triangulation_share > 0 and self.triangulation_k_src == 0 and self.triangulation_k_dst == 0:
            raise ValueError("triangulation_share > 0 needs triangulation_k_src or triangulation_k_dst above 0 "
                             "(a context of the query alone teaches nothing of either end)")
        return self


class ModelConfig(Section):
    preset: Literal["tiny", "mini", "small", "base"] = Field("tiny", description="MaxText model preset")
    overrides: dict[str, Any] = Field(default_factory=dict, description="extra MaxText keys")


class SlurmConfig(Section):
    job_name: str = Field("pingctl-train", description="SLURM job name")
    partition: str | None = Field(None, description="partition (-p)")
    account: str | None = Field(None, description="account (-A)")
    qos: str | None = Field(None, description="quality of service (--qos)")
    nodes: int = Field(1, ge=1, description="nodes; >1 starts one JAX process per node via srun")
    gpus_per_node: int = Field(1, ge=0, description="GPUs per node (--gpus-per-node)")
    cpus_per_task: int = Field(16, ge=1, description="CPUs per task")
    mem: str = Field("64G", description="memory per node (--mem)")
    time: str = Field("24:00:00", description="wall-clock limit (--time)")
    setup: str = Field("", description="shell lines run before training, e.g. module loads")
    venv: str | None = Field(None, description="virtual environment to activate (default: the current one)")


class ModalConfig(Section):
    app_name: str = Field("pingctl-train", description="Modal app name")
    gpu: str = Field("H100", description="GPU type")
    gpu_count: int = Field(1, ge=1, description="GPUs per container")
    volume: str = Field("pingctl-data", description="Modal Volume holding rows, checkpoints and TensorBoard")
    timeout_s: int = Field(86_400, ge=60, description="function timeout in seconds")
    wandb_secret: str | None = Field(None, description="name of a Modal secret holding WANDB_API_KEY (optional)")


class TrainConfig(Section):
    target: str = Field("local", pattern=r"^[a-z][a-z0-9_-]*$",
                        description="where to train: an engine of pingctl.executor.registry (local, slurm, modal)")
    run_dir: str = Field("runs/train", description="run directory (config, MaxText yml, checkpoints, logs)")
    train_rows: str = Field("", description="build-rows output of the training split")
    eval_rows: str | None = Field(None, description="build-rows output of the validation split")
    hardware: Literal["cpu", "gpu", "tpu"] = Field("cpu", description="MaxText hardware")
    attention: str = Field(
        "auto", description="MaxText attention kernel; auto: flash on a job of one GPU, dot_product otherwise"
    )
    steps: int = Field(200, ge=1, description="training steps")
    learning_rate: float = Field(3e-3, gt=0, description="peak learning rate (cosine schedule)")
    warmup_fraction: float = Field(0.05, ge=0, lt=1, description="share of steps spent warming up")
    eval_interval: int = Field(50, ge=-1, description="evaluate every N steps (0 or -1 = never)")
    eval_steps: int = Field(10, ge=1, description="eval batches per evaluation")
    checkpoint_period: int = Field(50, ge=1, description="save a checkpoint every N steps")
    max_minutes: float | None = Field(
        None, gt=0,
        description="time bound of one invocation: after this many minutes, checkpoint the step in progress and "
        "stop (None = train all steps)",
    )
    log_period: int = Field(10, ge=1, description="MaxText's log period in steps (full metric lines; pingctl flushes TensorBoard events every step)")
    jax_cache_dir: str = Field("~/.cache/pingctl/jax", description="persistent XLA compilation cache")
    wandb: bool = Field(False, description="also log to Weights & Biases (WANDB_API_KEY from the environment)")
    wandb_project: str = Field("pingctl", description="W&B project")
    processes: int = Field(
        1, ge=1, description="local CPU runs: JAX processes on this machine, each reading its share of the rows "
        "(the multi-node path, on one machine; several nodes: train.slurm.nodes)")
    slurm: SlurmConfig = SlurmConfig()
    modal: ModalConfig = ModalConfig()

    @model_validator(mode="after")
    def _processes_are_local_cpu(self):
        if self.processes > 1 and (self.target != "local" or self.hardware != "cpu"):
            raise ValueError(f"train.processes {self.processes} starts CPU processes on this machine (target local, "
                             f"hardware cpu; this run: {self.target}, {self.hardware}); on GPUs one process drives a "
                             "node's GPUs: several nodes are train.slurm.nodes")
        return self


class SampleConfig(Section):
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1.0, description="nucleus sampling mass")
    seed: int = Field(0, ge=0, description="sampling seed")


class EvalConfig(Section):
    queries: int = Field(300, ge=1, description="test packets evaluated (a seeded random subset)")
    context: int = Field(16, ge=0, description="preceding measurements of the probe in the prompt")
    context_policy: Literal["probe", "cold", "none", "both", "pair", "fair"] = Field(
        "probe", description="probe: its preceding test packets; cold: excluding the queried pair; none; "
        "both: the probe's packets to other destinations and the destination's from other sources (train split); "
        "pair: the pair's own earlier packets; fair (eval --regimes): pair for the time regime, both for the others")
    context_dst: int | None = Field(
        None, ge=0, description="--context-policy both: measurements of the destination side (null: as eval.context)")
    context_per_pair: int | None = Field(
        None, ge=0, description="cap per (src, dst) pair in the prompt (null: as the run was trained; 0: none)")
    seed: int = Field(0, ge=0, description="seed of the packet subset and Vivaldi")
    recalibration: Literal["pooled", "own"] = Field(
        "pooled", description="eval --regimes: the held-out regimes' recalibration map, fitted on their val sets "
        "together (pooled) or one per regime on its own (own)")
    weights: Literal["pooled", "own"] = Field(
        "own", description="eval --regimes: the combined answer's weight for the held-out regimes, vouched for by "
        "their val sets together (pooled) or each regime's by its own (own)")


class Config(Section):
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    rows: RowsConfig = RowsConfig()
    loader: LoaderConfig = LoaderConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    sample: SampleConfig = SampleConfig()
    eval: EvalConfig = EvalConfig()


# ---------------------------------------------------------------- loading


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_field_paths(ann, f"{prefix}{name}."))
        else:
            out.append(f"{prefix}{name}")
    return out


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    known = _field_paths(Config)
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            near = difflib.get_close_matches(path, known, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            lines.append(f"  {path}: unknown key{hint}")
            continue
        if e["type"] == "invalid_key":  # YAML reads `1:` or `true:` as a number or a boolean
            lines.append(f"  {path}: a key must be a name, not the {type(e.get('input')).__name__} "
                         f"{e.get('input')!r}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if isinstance(e.get("input"), dict):  # a rule over several keys of a section: its message names them
            lines.append(f"  {path}: {msg}")
            continue
        lines.append(f"  {path} = {e.get('input')!r}: {msg}")
    lines.append("  (see `pingctl config show` for every key and its current value)")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: bad key {key!r}")
    try:
        value = yaml.load(raw, Loader=UniqueKeyLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _set_path(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[path[-1]] = value


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one:
    a setting silently overridden further down the file)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a name, not {type(key).__name__} {key!r}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in this mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Times stay text: the fields that hold one parse it themselves (with a message naming the
# field), where PyYAML's own timestamp constructor raised a bare ValueError on 2024-13-01.
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node))


def load_config(
    path: Path | str | None = None,
    overrides: list[str] | None = None,
    cli_values: dict[str, Any] | None = None,
) -> Config:
    """Resolve defaults < YAML < `key=value` overrides < explicit CLI values (dotted keys)."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"{path} is a directory; --config takes a YAML file (`pingctl config init` writes one)")
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); a config file is YAML") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}:{where} is not valid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
        tree = loaded
        source = str(path)
    for item in overrides or []:
        keys, value = parse_override(item)
        _set_path(tree, keys, value)
        source += f" + {item}"
    given = {k: v for k, v in (cli_values or {}).items() if v is not None}
    for dotted, value in given.items():
        _set_path(tree, dotted.split("."), value)
    if given:
        source += " + command-line options"
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation(e, source)) from None


# ---------------------------------------------------------------- writing


def _yaml_scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def _render(model: BaseModel, indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            if indent == 0:
                lines.append("")
            lines.append(f"{pad}{name}:")
            lines.extend(_render(value, indent + 1))
            continue
        if field.description:
            lines.append(f"{pad}# {field.description}")
        dumped = value.model_dump() if isinstance(value, BaseModel) else value
        if isinstance(dumped, tuple):
            dumped = list(dumped)
        lines.append(f"{pad}{name}: {_yaml_scalar(dumped)}")
    return lines


def commented_yaml(cfg: Config | None = None) -> str:
    """The full config as YAML, each key preceded by its description."""
    cfg = cfg or Config()
    head = [
        "# pingctl configuration. Every subcommand reads this file with --config FILE;",
        "# override any key on the command line with --set section.key=value.",
    ]
    return "\n".join(head + _render(cfg, 0)) + "\n"
