"""The Grain pipeline: probe rows -> packed MaxText batches.

    element indices into the plan (record, rows) -> seed/shuffle/repeat (per-epoch
    reseeding) -> random_map(PackSequences) -> shard by process -> to_iter_dataset
    -> flat_map(rows) -> window shuffle (train) -> batch into the MaxText features
    -> mp_prefetch (workers)

An element packs up to `loader.rows_per_element` full rows from one record, read and
decoded once per process (`record_cache`: a record can be 8 MB, and every epoch visits it
many times). A record gets about one row per `seq_len` tokens of its history per epoch, at
least `contexts_per_record`, split over several elements when long. The window shuffle is a
block shuffle (`shuffle.py`: it fills a window, then emits it shuffled), so the steps
spanning one window see only `shuffle_window / rows_per_element` records: with 32 rows per element
and batch 8 that was 32 probes for 128 consecutive steps, and the model fitted each
group of probes in turn and forgot the last (eval loss 2.9 vs train 1.4). Few rows per
element keep every stretch of steps mixed. The eval pass is shuffled with its own fixed
seed, so MaxText's first `eval_steps` batches sample many records, not the first few.
Grain derives every element's RNG from the seed, the epoch and the element index, so the
pipeline is deterministic and its iterator state (Grain checkpointing) restores the exact
data position. With `loader.triangulation_share`, that share of the elements have all their rows
packed with triangulation contexts (`triangulation.py`), which read destination records at random
from inside the element's map, with the same RNG: the plan, the state and the determinism
stay Grain's.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from pingctl.artifacts.records import destination_index, destination_rows, read_manifest
from pingctl.config import LoaderConfig
from pingctl.errors import PingctlError
from pingctl.loader.hints import Hints
from pingctl.loader.record_cache import RecordCache
from pingctl.loader.sequences import pack_sequences, Shaping
from pingctl.loader.triangulation import (DestinationIndex, DestinationReader, NO_TRIANGULATION, Triangulation,
                                          pack_element, triangulation_rows)
from pingctl.processes import die_with_parent
from pingctl.tokenizer.spec import fields, get_spec, token_fields

FEATURES = ("inputs", "inputs_position", "inputs_segmentation", "targets", "targets_position", "targets_segmentation")
TOKENS_PER_MEASUREMENT_GUESS = 16  # compact IPv4 with a delta timestamp
# Grain hands each array a worker yields to the trainer in a shared-memory segment of its own,
# whose making (create, register with the resource tracker, map, unlink) cost ~1 ms a batch, 40%
# of the loader's own work on a batch of 8 x 1024: the six features travel as one block (one
# segment), the few bytes of statistics pickled. Large arrays must not be pickled: a worker that
# Grain stops while its queue feeds one into a full pipe waits out Grain's 25 s join timeout
# (docs/loader.md, "Workers").
MIN_SHM_BYTES = 4096


def element_plan(manifest: dict, seq_len: int, min_per_record: int, rows_per_element: int) -> np.ndarray:
    """int64[E, 2]: (record id over all files in order, rows to pack) per element of an epoch."""
    sizes = np.array([n for per_file in manifest["record_measurements"] for n in per_file], np.int64)
    per_row = max(1, seq_len // TOKENS_PER_MEASUREMENT_GUESS)
    rows = np.maximum(min_per_record, np.ceil(sizes / per_row)).astype(np.int64)
    chunks = -(-rows // rows_per_element)
    rows_each = -(-rows // chunks)
    return np.stack([np.repeat(np.arange(len(sizes)), chunks), np.repeat(rows_each, chunks)], axis=1)


def auto_workers(requested: int) -> int:
    if requested >= 0:
        return requested
    cpus = os.cpu_count() or 1
    # On a 2-core box the trainer needs the cores; workers only pay off with spare ones.
    return 0 if cpus <= 2 else min(cpus // 2, 16)


class _RecordReader:
    """Lazily opened in each worker process (ArrayRecord readers do not pickle)."""

    def __init__(self, files: list[str]):
        self.files = files
        self._source = None

    def __getstate__(self):
        return {"files": self.files, "_source": None}

    def get(self, record_id: int):
        if self._source is None:
            from grain.sources import ArrayRecordDataSource

            self._source = ArrayRecordDataSource(self.files)
        return self._source[int(record_id)]


def loss_keep_table(loss_keep: dict[str, float], scheme: str) -> np.ndarray | None:
    """Keep share per field index of `tokenizer.spec.fields` (None: every target counts)."""
    names = fields(get_spec(scheme))
    unknown = sorted(set(loss_keep) - set(names))
    if unknown:
        raise PingctlError(f"loader.loss_keep: unknown field(s) {unknown} for the {scheme} scheme; fields are {list(names)}")
    if all(loss_keep.get(n, 1.0) == 1.0 for n in names):
        return None
    return np.array([loss_keep.get(n, 1.0) for n in names])


def _transforms(
    plan: np.ndarray, files: list[str], seq_len: int, mode_p: np.ndarray, scheme: str, rows_per_element: int, keep,
    shaping, tri: Triangulation = NO_TRIANGULATION, destinations: DestinationReader | None = None,
    row_ids: bool = False,
):
    import grain

    spec = get_spec(scheme)

    class PackSequences(grain.transforms.RandomMap):
        def __init__(self):
            self.records = RecordCache(_RecordReader(files), scheme)
            self.plan = plan.tolist()

        def random_map(self, element: int, rng: np.random.Generator):
            record_id, n_rows = self.plan[element]
            rec, lengths = self.records.get(record_id)
            n_tri = triangulation_rows(rng, n_rows, tri.share)
            if n_tri:
                seqs = pack_element(rec, rng, n_rows - n_tri, n_tri, seq_len, mode_p, scheme, shaping, tri,
                                    destinations.lookup(), lengths)
            else:
                seqs = pack_sequences(rec, rng, n_rows, seq_len, mode_p, scheme, shaping, lengths)
            out = {
                "tokens": seqs.tokens,
                "segment": seqs.segment,
                "position": seqs.position,
                "modes": seqs.modes,
                "measurements": seqs.measurements,
            }
            if keep is not None:  # drawn here, after the rows, so the rows do not depend on it
                out["loss"] = rng.random(seqs.tokens.shape) < keep[token_fields(seqs.tokens, spec)]
            if row_ids:  # a row's id in its epoch: its plan element, then its place in the element
                out["row_id"] = element * rows_per_element + np.arange(len(seqs.tokens), dtype=np.int64)
            return out

    class SplitSequences(grain.experimental.FlatMapTransform):
        max_fan_out = rows_per_element

        def flat_map(self, element):
            return element_rows(element)

    return PackSequences(), SplitSequences()


def triangulation(rows_dir: Path, manifest: dict, cfg: LoaderConfig, scheme: str = "compact"
                  ) -> tuple[Triangulation, DestinationReader | None]:
    """The triangulation settings and the destination records they read (None when off):
    those `build-rows --by both` put beside the probe rows."""
    if cfg.triangulation_share <= 0:
        return NO_TRIANGULATION, None
    hints = Hints.load(cfg.hints_file, cfg.hint_share) if cfg.hints_file else None
    tri = Triangulation(cfg.triangulation_share, cfg.triangulation_k_src, cfg.triangulation_k_dst,
                        cfg.triangulation_per_pair, hints, cfg.relative_target)
    if manifest.get("by") == "destination":
        raise PingctlError(f"{rows_dir}: destination records; triangulation contexts (loader.triangulation_share) "
                           "draw their queries from probe rows: give the probe rows built with --by both")
    dst_dir = destination_rows(rows_dir, manifest)
    if dst_dir is None:
        raise PingctlError(f"{rows_dir}: built without destination records, which loader.triangulation_share "
                           f"{cfg.triangulation_share} needs: rebuild with `pingctl build-rows SPLIT -o {rows_dir} "
                           "--by both --force`, or set loader.triangulation_share=0")
    dst_manifest = read_manifest(dst_dir)
    index = DestinationIndex(destination_index(dst_dir, dst_manifest))
    return tri, DestinationReader(index, _RecordReader([str(dst_dir / f) for f in dst_manifest["files"]]), scheme)


def check_triangulation(rows_dir: Path | str, cfg: LoaderConfig) -> None:
    """Refuse, before a training worker starts, rows that `loader.triangulation_share` cannot
    use (a PingctlError naming the rows and the fix), as make_dataset would inside it."""
    if cfg.triangulation_share > 0:
        triangulation(Path(rows_dir), read_manifest(rows_dir), cfg)


def _worker_dies_with(parent: int, _index: int, _count: int) -> None:
    # Grain starts its workers from threads of its own, whose end would fire PR_SET_PDEATHSIG
    # early: the workers watch the parent's pid instead.
    die_with_parent(parent, pdeathsig=False)


def element_rows(element: dict) -> list[dict]:
    """An element's stacked rows (`PackSequences`' arrays) as one dict per row, views of them."""
    return [{k: v[i] for k, v in element.items()} for i in range(len(element["tokens"]))]


def batch_features(rows: list[dict], size: int, with_stats: bool = False, one_block: bool = False) -> dict:
    """Rows -> the six int32 [size, seq_len] arrays the MaxText train step takes, written
    straight into one int32 [6, size, seq_len] block (`FEATURES` order; rows past `len(rows)`
    are padding: segment 0, no loss, no attention). Each feature is a view of the block; with
    `one_block` the block itself travels (a worker hands it over as one shared-memory segment,
    `_from_block` takes the views in the trainer's process)."""
    n = len(rows)
    block = (np.empty if n == size else np.zeros)((len(FEATURES), size, len(rows[0]["tokens"])), np.int32)
    inputs, inputs_pos, inputs_seg, targets, targets_pos, targets_seg = block
    for i, row in enumerate(rows):
        inputs[i] = row["tokens"]
        inputs_pos[i] = row["position"]
        inputs_seg[i] = row["segment"]
    targets[:, :-1] = inputs[:, 1:]
    targets[:, -1] = 0
    targets_pos[:] = inputs_pos
    # A target counts only when the next token is in the same segment (never padding,
    # never the first token of the next context).
    same = (inputs_seg[:, 1:] == inputs_seg[:, :-1]) & (inputs_seg[:, :-1] > 0)
    if "loss" in rows[0]:  # loader.loss_keep: a target counts only if its token was kept
        same[:n] &= np.stack([row["loss"][1:] for row in rows])
    np.multiply(inputs_seg[:, :-1], same, out=targets_seg[:, :-1], casting="unsafe")
    targets_seg[:, -1] = 0
    out = {"features": block} if one_block else dict(zip(FEATURES, block))
    if "row_id" in rows[0]:  # make_dataset(row_ids=True): which rows this batch holds (padding has none)
        out["row_ids"] = np.array([row["row_id"] for row in rows], np.int64)
    if with_stats:  # side statistics for benches and logs; MaxText ignores keys it does not know
        out["stat_modes"] = np.sum([row["modes"] for row in rows], axis=0, dtype=np.int32)
        out["stat_measurements"] = np.int32(sum(int(row["measurements"]) for row in rows))
    return out


def make_dataset(
    rows_dir: Path | str,
    cfg: LoaderConfig,
    scheme: str = "compact",
    *,
    train: bool = True,
    shard_index: int = 0,
    shard_count: int = 1,
    num_epochs: int | None = None,
    batch_size: int | None = None,
    with_stats: bool = False,
    row_ids: bool = False,
):
    """A Grain IterDataset of MaxText batches. Eval (`train=False`): one deterministic pass.

    Process `shard_index` of `shard_count` packs every `shard_count`-th element of the one shuffled
    order, each with the RNG of its place in that order, so the processes' rows together are the
    rows one process would pack. `row_ids`: each batch also holds its rows' ids (`row_ids`)."""
    import grain

    rows_dir = Path(rows_dir)
    manifest = read_manifest(rows_dir)
    files = [str(rows_dir / f) for f in manifest["files"]]
    weights = np.asarray(cfg.mode_weights, float)  # LoaderConfig checked them: >= 0, not all zero
    mode_p = weights / weights.sum()
    plan = element_plan(manifest, cfg.seq_len, cfg.contexts_per_record, cfg.rows_per_element)
    if len(plan) == 0:
        raise PingctlError(f"{rows_dir}: no records")

    _configure_grain(cfg)
    keep = loss_keep_table(cfg.loss_keep, scheme) if train else None  # eval loss stays the plain NLL
    # Shaping changes which rows exist, so train and eval share it (the gap stays comparable).
    shaping = Shaping(cfg.result_last, cfg.max_per_pair, cfg.pair_history_share, cfg.pair_history_k)
    tri, destinations = triangulation(rows_dir, manifest, cfg, scheme)  # train and eval alike, as shaping
    make_rows, split_rows = _transforms(plan, files, cfg.seq_len, mode_p, scheme, cfg.rows_per_element, keep,
                                        shaping, tri, destinations, row_ids)
    # The elements are indices into the plan: a range source costs Grain no per-read accounting
    # (a source of the plan itself records each read's bytes and latency, ~3% of the loader).
    ds = grain.MapDataset.range(len(plan))
    if train:
        ds = ds.seed(cfg.seed).shuffle().repeat(num_epochs)
    else:
        ds = ds.seed(cfg.eval_seed).shuffle()
    # Shard after the map: an element's RNG comes from its index and the map's depth below the seed,
    # which a shard before it would change (another process count, other rows)
    ds = ds.random_map(make_rows)
    if shard_count > 1:
        ds = ds[shard_index::shard_count]
    workers = auto_workers(cfg.workers)
    it = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(_read_options(cfg, workers)), split_rows)
    if train and cfg.shuffle_window > 1:
        from pingctl.loader.shuffle import WindowShuffle  # imports Grain

        it = WindowShuffle(it, window_size=cfg.shuffle_window, seed=cfg.seed)
    bsz = batch_size or cfg.batch_size
    # The step is compiled for one batch shape: the last eval batch is padded (train drops it).
    to_batch = functools.partial(batch_features, size=bsz, with_stats=with_stats, one_block=workers > 0)
    it = it.batch(bsz, drop_remainder=train, batch_fn=to_batch)
    if workers > 0:
        _absl_flags_ready()
        it = grain.experimental.WithOptionsIterDataset(it, grain.experimental.DatasetOptions(min_shm_size=MIN_SHM_BYTES))
        return it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2),
                              worker_init_fn=functools.partial(_worker_dies_with, os.getpid())).map(_from_block)
    return it


def _from_block(batch: dict) -> dict:
    """A worker's one block (`batch_features(one_block=True)`) as the six feature views."""
    block = batch.pop("features")
    return {**dict(zip(FEATURES, block)), **batch}


def _absl_flags_ready() -> None:
    """Grain's worker start reads absl flags. Inside `absl.app.run` (the train worker) they
    are parsed; in any other host program (tests, notebooks, benches) nobody parsed them,
    and once some library defines flags Grain raises. Defaults are what we want there."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _configure_grain(cfg: LoaderConfig) -> None:
    import grain

    if cfg.debug or cfg.visualize:
        _absl_flags_ready()  # Grain reads its settings as absl flags: unparsed, it reads the defaults
    if cfg.debug:
        grain.config.update("py_debug_mode", True)
    if cfg.visualize:  # an empty directory is Grain's "log it" (a file is not supported)
        grain.config.update("py_dataset_visualization_output_dir", "")


def epoch_rows(rows_dir: Path | str, cfg: LoaderConfig) -> int:
    manifest = read_manifest(rows_dir)
    return int(element_plan(manifest, cfg.seq_len, cfg.contexts_per_record, cfg.rows_per_element)[:, 1].sum())


def read_threads(cfg: LoaderConfig, workers: int) -> int:
    """Grain read threads per process. Elements are NumPy-heavy Python: more than one thread
    only fights over the GIL (16, Grain's default, measured ~7x slower); parallelism comes from
    workers. Automatic (-1): none. A worker's one job is making batches, so a thread there has
    nothing to overlap with. Without workers the host's batch making already overlaps the
    step: JAX dispatches a step without waiting for it, and MaxText's loop reads a step's
    metrics only after dispatching the next one. A thread beside the consumer only adds GIL
    handoffs (~100x the context switches, ~1.4x the CPU per token, docs/benchmarks.md)."""
    if cfg.read_threads >= 0:
        return cfg.read_threads
    return 0


def _read_options(cfg: LoaderConfig, workers: int):
    import grain

    return grain.ReadOptions(num_threads=read_threads(cfg, workers), prefetch_buffer_size=cfg.read_prefetch)
