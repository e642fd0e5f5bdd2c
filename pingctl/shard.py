"""Split a canonical measurement table into train/val/test Parquet shards with DuckDB.

Strategies
- time:   rows ordered by event_time; the last `test_fraction` of rows is test, the
          `val_fraction` before it val. Cuts fall between distinct timestamps, so every
          test row is strictly later than every train row (temporal generalization).
- probe:  whole vantage points held out (probe = prb_id, else src_addr).
- target: whole destinations (dst_addr) held out.
- pair:   whole (src_addr, dst_addr) pairs held out.
- random: each row independently.
- regimes: train/val and four test sets from one table, one per question a user asks:
          test_time (later packets of train pairs), test_pair (unseen pairs of seen ends),
          test_probe (unseen sources), test_target (unseen destinations), and a val set per
          held-out regime (val_pair, val_probe, val_target; val is the time regime's); see
          `_label_regimes` and docs/data.md.
For probe/target/pair the fractions are shares of *groups*, chosen exactly (groups ranked by
an md5 of key+seed), so row shares follow group sizes; the summary reports both.

Everything is computed in a DuckDB database under the output's temp directory, with
`memory_limit` in force, so inputs far larger than memory spill instead of failing. The input
is read and checked a fixed number of times whatever its size, its rows are sorted once and
streamed to their shards' files, and every check of the regimes reads one aggregate per pair, not
the rows.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

from pingctl import __version__
from pingctl.artifacts.table import REGIME_SPLITS, SPLITS, refuse_whole_shard_output, resolve_inputs
from pingctl.atomic import MANIFEST, atomic_dir, check_replaceable, write_json
from pingctl.benchutil import run_measured
from pingctl.config import ShardConfig
from pingctl.errors import ConfigError, PingctlError
from pingctl.schema.columns import COLUMNS, arrow_schema
from pingctl.schema.duck import all_rejected, canonical_query, connect, one

Progress = Callable[[str, int, int], None]

# The most shard files `_write_splits` writes at once (each holds up to a row group of rows in memory)
_OPEN_SHARDS = 64

_PROBE_KEY = "COALESCE('prb:' || prb_id::VARCHAR, 'src:' || src_addr)"
_GROUP_KEY = {
    "probe": _PROBE_KEY,
    "target": "dst_addr",
    "pair": "src_addr || '>' || dst_addr",
}
# The same keys in `split_groups` (pk: the probe key)
_GROUP_OF_SPLIT_GROUPS = {"probe": "pk", "target": "dst_addr", "pair": "src_addr || '>' || dst_addr"}
# Why a valid row of a regimes split is in no output (counted in the manifest, never silent).
DROP_REASONS = {
    "probe_and_target": "a held-out source measuring a held-out destination: both ends unseen, "
                        "which is none of the four regimes",
    "destination_not_in_train": "a held-out source's packet to a destination no train packet has "
                                "(only held-out sources measure it)",
    "source_not_in_train": "a packet to a held-out destination from a source no train packet has",
    "pair_not_in_train": "a packet after the time cut of a pair first measured after the train cut "
                         "(no train history to be later than)",
}


def splits_of(strategy: str) -> tuple[str, ...]:
    """The output splits of a strategy, in the order they are written and reported."""
    return REGIME_SPLITS if strategy == "regimes" else SPLITS


def _ts(value) -> str:
    return f"TIMESTAMPTZ '{value.isoformat()}'"


def _noop(_step: str, _done: int, _total: int) -> None:
    pass


def _assign_splits(con, cfg: ShardConfig) -> dict:
    """Create the view `labelled` (valid rows and their split), the table `split_groups` and the
    view `assigned` (`labelled`'s rows in a split). Returns cut details, rows and shards."""
    val_f, test_f = cfg.val_fraction, cfg.test_fraction
    if val_f + test_f >= 1.0:  # the config model refuses it; a library caller may pass a model_construct
        raise ConfigError(f"val_fraction + test_fraction must be < 1 (got {val_f} + {test_f})")
    details: dict = {}
    splits = splits_of(cfg.strategy)
    if cfg.strategy == "regimes":
        details = _label_regimes(con, cfg)  # creates the view `labelled` itself
    elif cfg.strategy == "time":
        cuts = one(
            con,
            "SELECT quantile_disc(event_time, ?), quantile_disc(event_time, ?) "
            "FROM canonical WHERE reject_reason IS NULL",
            [1.0 - test_f - val_f, 1.0 - test_f],
        )
        val_start, test_start = cuts
        details = {"val_start": val_start, "test_start": test_start}
        # Rows at exactly the cut timestamp go to the later split; empty fractions mean no split.
        split_sql = (
            f"CASE WHEN {test_f} > 0 AND event_time >= {_ts(test_start)} THEN 'test' "
            f"WHEN {val_f} > 0 AND event_time >= {_ts(val_start)} THEN 'val' ELSE 'train' END"
        )
        source = "canonical"
    elif cfg.strategy in _GROUP_KEY:
        con.execute(
            f"""CREATE TEMP TABLE groups AS
            WITH k AS (SELECT DISTINCT {_GROUP_KEY[cfg.strategy]} AS gkey FROM canonical
                       WHERE reject_reason IS NULL),
                 r AS (SELECT gkey, row_number() OVER (ORDER BY md5(gkey || ':{int(cfg.seed)}'), gkey) - 1 AS rk,
                              count(*) OVER () AS n FROM k)
            SELECT gkey, CASE WHEN rk < round(n * {test_f}) THEN 'test'
                              WHEN rk < round(n * {test_f}) + round(n * {val_f}) THEN 'val'
                              ELSE 'train' END AS split
            FROM r"""
        )
        details = {
            "groups": dict(con.execute("SELECT split, count(*) FROM groups GROUP BY split").fetchall())
        }
        source = (
            f"(SELECT c.*, g.split AS gsplit FROM (SELECT *, {_GROUP_KEY[cfg.strategy]} AS gkey "
            "FROM canonical) c JOIN groups g USING (gkey))"
        )
        split_sql = "gsplit"
    else:  # random
        u = f"(hash(msm_id, event_time, src_addr, dst_addr, rtt, _row, {int(cfg.seed)}) % 1000000) / 1e6"
        split_sql = f"CASE WHEN {u} < {test_f} THEN 'test' WHEN {u} < {test_f + val_f} THEN 'val' ELSE 'train' END"
        source = "canonical"
    if cfg.strategy != "regimes":
        con.execute(
            f"CREATE TEMP VIEW labelled AS SELECT *, {split_sql} AS split FROM {source} WHERE reject_reason IS NULL"
        )
    counts = _split_groups(con, "labelled", by_pair=cfg.strategy == "regimes")
    details["dropped"] = {k[len("drop:"):]: v for k, v in sorted(counts.items()) if k.startswith("drop:")}
    shards = {s: max(1, math.ceil(counts.get(s, 0) / cfg.rows_per_shard)) for s in splits}
    # a row's shard is a content hash modulo its split's shards (`_write_splits`)
    con.execute("CREATE TEMP VIEW assigned AS SELECT * FROM labelled WHERE split NOT LIKE 'drop:%'")
    details["rows"] = {s: counts.get(s, 0) for s in splits}
    details["shards"] = shards
    return details


def _take(fraction: float) -> str:
    """How many of `n` ranked groups a regime holds out: round(n * fraction), at least one
    when the fraction is positive and at least one is left over (a small table still gets
    every test set), never all."""
    f = float(fraction)
    return f"(CASE WHEN {f} > 0 AND n > 1 THEN least(n - 1, greatest(1, round(n * {f}))) ELSE 0 END)"


def _held_out(con, table: str, keys_sql: str, regime: str, fraction: float, seed: int, val: float = 0.0) -> dict:
    """Create `table(k)`: the keys of `keys_sql` a regime holds out for its test set, ranked by
    md5 of regime:key:seed (the regime in the hash keeps the rankings of sources, destinations
    and pairs independent of each other), and `table_val(k)`: the next `val` times as many
    (its val set: disjoint from the test set, held out from train the same way; at least one
    when `val` > 0 and one key is left for train). Returns the group counts."""
    t = _take(fraction)
    v = (f"(CASE WHEN {float(val)} > 0 AND {t} > 0 AND n - {t} > 1 "
         f"THEN least(n - {t} - 1, greatest(1, round(n * {float(fraction) * float(val)}))) ELSE 0 END)")
    con.execute(
        f"""CREATE TABLE {table}_ranked AS
        WITH r AS (SELECT k, row_number() OVER (ORDER BY md5('{regime}:' || k || ':{int(seed)}'), k) - 1 AS rk,
                          count(*) OVER () AS n FROM ({keys_sql}))
        SELECT k, CASE WHEN rk < {t} THEN 'test' WHEN rk < {t} + {v} THEN 'val' END AS role FROM r"""
    )
    con.execute(f"CREATE TABLE {table} AS SELECT k FROM {table}_ranked WHERE role = 'test'")
    con.execute(f"CREATE TABLE {table}_val AS SELECT k FROM {table}_ranked WHERE role = 'val'")
    total = one(con, f"SELECT count(*) FROM ({keys_sql})")[0]
    return {"groups": total, "held_out": one(con, f"SELECT count(*) FROM {table}")[0],
            "val": one(con, f"SELECT count(*) FROM {table}_val")[0]}


def _source_components(con) -> dict:
    """Create `rg_src(src_addr, comp)`: sources as connected components of probe keys and
    source addresses. A probe's v4 and v6 addresses (and a changed DHCP address) are one
    source, and so are probes behind one shared address: holding out less than a whole
    component would leave a held-out source's id or address in train. Label propagation in
    SQL, on disk like the rest; it converges in as many rounds as the longest chain."""
    con.execute("CREATE TABLE rg_edges AS SELECT DISTINCT pk, src_addr FROM rg_triples")
    con.execute("CREATE TABLE rg_pk AS SELECT DISTINCT pk, pk AS comp FROM rg_edges")
    rounds = 0
    while True:
        rounds += 1
        con.execute("CREATE OR REPLACE TABLE rg_src AS SELECT e.src_addr, min(k.comp) AS comp "
                    "FROM rg_edges e JOIN rg_pk k USING (pk) GROUP BY e.src_addr")
        con.execute("CREATE OR REPLACE TABLE rg_pk_next AS SELECT e.pk, min(s.comp) AS comp "
                    "FROM rg_edges e JOIN rg_src s USING (src_addr) GROUP BY e.pk")
        changed = one(con, "SELECT count(*) FROM rg_pk_next n JOIN rg_pk o USING (pk) WHERE n.comp <> o.comp")[0]
        con.execute("DROP TABLE rg_pk")
        con.execute("ALTER TABLE rg_pk_next RENAME TO rg_pk")
        if not changed:
            break
    merged = one(con, "SELECT count(*) FROM (SELECT comp FROM rg_pk GROUP BY comp HAVING count(*) > 1)")[0]
    return {"probe_keys": one(con, "SELECT count(*) FROM rg_pk")[0],
            "source_addresses": one(con, "SELECT count(*) FROM rg_src")[0],
            "components_of_several_probe_keys": merged, "rounds": rounds}


def _label_regimes(con, cfg: ShardConfig) -> dict:
    """Create the view `labelled` (valid rows + split) for `--strategy regimes`.

    Everything but the time cut is decided per (src, dst) pair, from one pass that groups
    the rows by (probe key, src, dst):
    1. sources (components of probe key and address, `_source_components`) and destination
       addresses are held out by md5 rank: their rows are test_probe / test_target;
    2. of the pairs between kept sources and kept destinations, a share is held out for
       test_pair; the rest ("time pairs") are cut by time: rows from the cut on are
       test_time, the `val_fraction` before it val (the time regime's val set), the rest
       train. The cuts are quantiles
       of the times of all rows between kept ends, held-out pairs' included: step 3 depends
       on the cut, so the cut must not depend on step 3's outcome (held-out pairs are a
       hash-chosen sample, so the time pairs' share past the cut stays close to `regimes.time`);
    Steps 1 and 2 also hold out, next in the same md5 ranking, `regimes.val` times as many
    sources, destinations and pairs for val_probe, val_target and val_pair: each held-out
    regime's own val set (for the recalibration and the baseline choice `eval --regimes` fits
    on held-out val packets), disjoint from every test set by construction.
    3. a held-out pair with an end that no train row has goes back to the time pairs
       (train's ends only grow by this, so one pass settles it);
    4. rows that fit no regime are dropped with a reason (DROP_REASONS): a held-out source to
       a held-out destination, a held-out source's row to a destination train lacks (or a
       held-out destination's from a source train lacks), and test_time rows of a pair that
       has no train row.
    """
    r = cfg.regimes
    val_f, time_f = cfg.val_fraction, r.time
    details = _hold_out_groups(con, r, int(cfg.seed))
    join = _pair_join(con)
    val_start = test_start = None
    if val_f > 0 or time_f > 0:
        val_start, test_start = one(
            con,
            f"SELECT quantile_disc(c.event_time, ?), quantile_disc(c.event_time, ?) FROM canonical c "
            f"JOIN rg_pairs p ON {join} WHERE c.reject_reason IS NULL "
            "AND p.cls IN ('time', 'pair', 'val_pair')",
            [1.0 - time_f - val_f, 1.0 - time_f],
        )
    if val_start is None:  # no time pairs at all: every row is held out or dropped
        val_f = time_f = 0.0
    # Rows at exactly a cut go to the later split; a pair is in train when it has a row before the cut.
    cut = val_start if val_f > 0 else test_start if time_f > 0 else None
    _settle_held_out(con, details["pairs"], cut)
    in_train = "true" if cut is None else f"p.first < {_ts(cut)}"
    by_time = "".join(
        ([f"WHEN c.event_time >= {_ts(test_start)} THEN "
          f"CASE WHEN {in_train} THEN 'test_time' ELSE 'drop:pair_not_in_train' END "] if time_f > 0 else [])
        + ([f"WHEN c.event_time >= {_ts(val_start)} THEN 'val' "] if val_f > 0 else [])
    ) or "WHEN false THEN NULL "
    # _pair: the pair's rank in (src_addr, dst_addr) order, so a sort by it is a sort by the two texts
    con.execute(
        f"""CREATE TEMP VIEW labelled AS
        SELECT c.*, p.pair_rank AS _pair,
               CASE WHEN p.cls = 'time' THEN (CASE {by_time} ELSE 'train' END)
                    WHEN p.cls LIKE 'drop:%' OR p.cls LIKE 'val_%' THEN p.cls ELSE 'test_' || p.cls END AS split
        FROM canonical c JOIN rg_pairs p ON {join} WHERE c.reject_reason IS NULL"""
    )
    details.update({"val_start": val_start, "test_time_start": test_start,
                    "fractions": {"val": val_f, **r.model_dump()}})
    return details


def _pair_join(con) -> str:
    """How a row finds its pair in `rg_pairs`: by the pair's hash, one integer, where no two pairs
    share one (every row's pair is there, so none can match another's); else by the two texts,
    which cost a read of the rows several times more."""
    shared = one(con, "SELECT count(*) - count(DISTINCT pair_hash) FROM rg_pairs")[0]
    if shared:
        return "p.src_addr = c.src_addr AND p.dst_addr = c.dst_addr"
    return "p.pair_hash = hash(c.src_addr, c.dst_addr)"


def _hold_out_groups(con, r, seed: int) -> dict:
    """Steps 1 and 2 of `_label_regimes`: create `rg_pairs(src_addr, dst_addr, n, first, pair_rank,
    pair_hash, cls)`, each pair classed by the held-out sources, destinations and pairs (test and val) it
    belongs to, or 'time'. Returns the group counts."""
    # from `checked_groups` (grouped by probe id, not by the probe key: no text made per row)
    con.execute(
        f"""CREATE TABLE rg_triples AS SELECT {_PROBE_KEY} AS pk, src_addr, dst_addr, sum(n)::BIGINT AS n,
                   min(first) AS first
            FROM checked_groups WHERE reject_reason IS NULL GROUP BY ALL"""
    )
    details: dict = {"sources": _source_components(con)}
    details["sources"].update(_held_out(con, "rg_held_src", "SELECT DISTINCT comp AS k FROM rg_src", "probe",
                                        r.probe, seed, r.val))
    details["destinations"] = _held_out(con, "rg_held_dst", "SELECT DISTINCT dst_addr AS k FROM rg_triples",
                                        "target", r.target, seed, r.val)
    # A source or destination held out for a val set is as unseen as one held out for test, so
    # a pair of two held-out ends is dropped whichever sets they belong to.
    con.execute(
        """CREATE TABLE rg_pairs AS
        SELECT p.src_addr, p.dst_addr, p.n, p.first,
               dense_rank() OVER (ORDER BY p.src_addr, p.dst_addr) AS pair_rank,
               hash(p.src_addr, p.dst_addr) AS pair_hash,
               CASE WHEN (hs.k IS NOT NULL OR vs.k IS NOT NULL) AND (hd.k IS NOT NULL OR vd.k IS NOT NULL)
                         THEN 'drop:probe_and_target'
                    WHEN hs.k IS NOT NULL THEN 'probe' WHEN vs.k IS NOT NULL THEN 'val_probe'
                    WHEN hd.k IS NOT NULL THEN 'target' WHEN vd.k IS NOT NULL THEN 'val_target'
                    ELSE 'time' END AS cls
        FROM (SELECT src_addr, dst_addr, sum(n) AS n, min(first) AS first FROM rg_triples GROUP BY ALL) p
        JOIN rg_src s USING (src_addr)
        LEFT JOIN rg_held_src hs ON hs.k = s.comp
        LEFT JOIN rg_held_src_val vs ON vs.k = s.comp
        LEFT JOIN rg_held_dst hd ON hd.k = p.dst_addr
        LEFT JOIN rg_held_dst_val vd ON vd.k = p.dst_addr"""
    )
    details["pairs"] = _held_out(con, "rg_held_pair", "SELECT src_addr || '>' || dst_addr AS k FROM rg_pairs "
                                 "WHERE cls = 'time'", "pair", r.pair, seed, r.val)
    con.execute("UPDATE rg_pairs SET cls = 'pair' WHERE src_addr || '>' || dst_addr IN (SELECT k FROM rg_held_pair)")
    con.execute("UPDATE rg_pairs SET cls = 'val_pair' "
                "WHERE src_addr || '>' || dst_addr IN (SELECT k FROM rg_held_pair_val)")
    return details


def _settle_held_out(con, pairs: dict, cut) -> None:
    """Steps 3 and 4 of `_label_regimes` for the train cut `cut` (None: no time cut): held-out
    pairs with an end train lacks go back to the time pairs (counted into `pairs`), then
    held-out sources' and destinations' pairs whose other end train lacks are dropped."""
    before_cut = "true" if cut is None else f"first < {_ts(cut)}"
    train_ends = ("CREATE OR REPLACE TABLE rg_train_src AS SELECT DISTINCT src_addr FROM rg_pairs "
                  f"WHERE cls = 'time' AND {before_cut}; "
                  "CREATE OR REPLACE TABLE rg_train_dst AS SELECT DISTINCT dst_addr FROM rg_pairs "
                  f"WHERE cls = 'time' AND {before_cut}")
    con.execute(train_ends)
    con.execute("""UPDATE rg_pairs SET cls = 'time' WHERE cls IN ('pair', 'val_pair') AND (
                     src_addr NOT IN (SELECT src_addr FROM rg_train_src)
                     OR dst_addr NOT IN (SELECT dst_addr FROM rg_train_dst))""")
    pairs["returned_to_train"] = (pairs["held_out"]
                                  - one(con, "SELECT count(*) FROM rg_pairs WHERE cls = 'pair'")[0])
    pairs["val_returned_to_train"] = (pairs["val"]
                                      - one(con, "SELECT count(*) FROM rg_pairs WHERE cls = 'val_pair'")[0])
    con.execute(train_ends)
    con.execute("UPDATE rg_pairs SET cls = 'drop:destination_not_in_train' WHERE cls IN ('probe', 'val_probe') "
                "AND dst_addr NOT IN (SELECT dst_addr FROM rg_train_dst)")
    con.execute("UPDATE rg_pairs SET cls = 'drop:source_not_in_train' WHERE cls IN ('target', 'val_target') "
                "AND src_addr NOT IN (SELECT src_addr FROM rg_train_src)")


def _packets_in_several_splits(con) -> int:
    """Packets (pair and time) found in more than one split. A pair whose splits' time spans
    do not overlap has none, which is every pair the regimes make: only the rows of pairs with
    overlapping spans (none, unless the labelling is wrong) are grouped packet by packet."""
    con.execute("""CREATE TEMP TABLE rg_overlap AS
        WITH s AS (SELECT split, src_addr, dst_addr, min(lo) AS lo, max(hi) AS hi FROM split_groups GROUP BY ALL)
        SELECT DISTINCT a.src_addr, a.dst_addr FROM s a JOIN s b USING (src_addr, dst_addr)
        WHERE a.split < b.split AND a.lo <= b.hi AND b.lo <= a.hi""")
    if not one(con, "SELECT count(*) FROM rg_overlap")[0]:
        return 0
    return int(one(con, "SELECT count(*) FROM (SELECT src_addr, dst_addr, event_time FROM assigned "
                        "JOIN rg_overlap USING (src_addr, dst_addr) GROUP BY ALL HAVING count(DISTINCT split) > 1)")[0])


def _verify_regimes(con) -> dict:
    """Check each regime's rule on the rows as assigned; every count must be 0. The rules are
    about pairs, sources, destinations and time spans, so they read `split_groups`, not the rows."""
    pk = "pk"
    train = "(SELECT * FROM split_groups WHERE split = 'train')"

    def count(sql: str) -> int:
        return int(one(con, f"SELECT count(*) FROM ({sql})")[0])

    def distinct(split: str, cols: str) -> str:
        return f"SELECT DISTINCT {cols} FROM split_groups WHERE split = '{split}'"

    def later(split: str) -> str:
        return (f"SELECT t.src_addr, t.dst_addr FROM (SELECT src_addr, dst_addr, min(lo) AS lo FROM split_groups "
                f"WHERE split = '{split}' GROUP BY ALL) t JOIN (SELECT src_addr, dst_addr, max(hi) AS hi "
                f"FROM {train} GROUP BY ALL) r USING (src_addr, dst_addr) WHERE t.lo <= r.hi")

    return {
        # a packet = its pair and time: its split must follow from them alone
        "packets_in_several_splits": _packets_in_several_splits(con),
        "time_pairs_not_in_train": count(f"{distinct('test_time', 'src_addr, dst_addr')} EXCEPT "
                                         f"SELECT src_addr, dst_addr FROM {train}"),
        "time_rows_not_after_train": count(later("test_time")),
        "val_rows_not_after_train": count(later("val")),
        "pair_pairs_in_train": count(f"{distinct('test_pair', 'src_addr, dst_addr')} INTERSECT "
                                     f"SELECT src_addr, dst_addr FROM {train}"),
        "pair_sources_not_in_train": count(f"{distinct('test_pair', 'src_addr')} EXCEPT SELECT src_addr FROM {train}"),
        "pair_destinations_not_in_train": count(f"{distinct('test_pair', 'dst_addr')} EXCEPT "
                                                f"SELECT dst_addr FROM {train}"),
        "probe_sources_in_train": count(f"{distinct('test_probe', 'src_addr')} INTERSECT SELECT src_addr FROM {train}"),
        "probe_ids_in_train": count(f"{distinct('test_probe', pk)} INTERSECT SELECT {pk} FROM {train}"),
        "probe_destinations_not_in_train": count(f"{distinct('test_probe', 'dst_addr')} EXCEPT "
                                                 f"SELECT dst_addr FROM {train}"),
        "target_destinations_in_train": count(f"{distinct('test_target', 'dst_addr')} INTERSECT "
                                              f"SELECT dst_addr FROM {train}"),
        "target_sources_not_in_train": count(f"{distinct('test_target', 'src_addr')} EXCEPT "
                                             f"SELECT src_addr FROM {train}"),
        # each held-out regime's val set follows its regime's rule and shares no group with any test set
        "val_pair_pairs_in_train": count(f"{distinct('val_pair', 'src_addr, dst_addr')} INTERSECT "
                                         f"SELECT src_addr, dst_addr FROM {train}"),
        "val_probe_sources_in_train": count(f"{distinct('val_probe', 'src_addr')} INTERSECT "
                                            f"SELECT src_addr FROM {train}"),
        "val_probe_ids_in_train": count(f"{distinct('val_probe', pk)} INTERSECT SELECT {pk} FROM {train}"),
        "val_target_destinations_in_train": count(f"{distinct('val_target', 'dst_addr')} INTERSECT "
                                                  f"SELECT dst_addr FROM {train}"),
        "val_pairs_in_a_test_set": count(f"{distinct('val_pair', 'src_addr, dst_addr')} INTERSECT "
                                         f"SELECT src_addr, dst_addr FROM split_groups WHERE split LIKE 'test_%'"),
        "val_sources_in_a_test_set": count(f"{distinct('val_probe', 'src_addr')} INTERSECT "
                                           f"SELECT src_addr FROM split_groups WHERE split LIKE 'test_%'"),
        "val_destinations_in_a_test_set": count(f"{distinct('val_target', 'dst_addr')} INTERSECT "
                                                f"SELECT dst_addr FROM split_groups WHERE split LIKE 'test_%'"),
    }


def _verify(con, strategy: str) -> dict:
    """Check disjointness from the rows as assigned (`split_groups`); raises if violated."""
    checks: dict = {}
    if strategy == "regimes":
        checks = _verify_regimes(con)
        checks["disjoint"] = ok = not any(checks.values())
        if not ok:
            raise PingctlError(f"internal check failed: a regime's rule does not hold ({checks})")
        return checks
    if strategy == "time":
        spans = {
            s: (lo, hi)
            for s, lo, hi in con.execute(
                "SELECT split, min(lo), max(hi) FROM split_groups GROUP BY split"
            ).fetchall()
        }
        ordered = [spans[s] for s in SPLITS if s in spans]  # time strategy: train, val, test
        ok = all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))
        checks["time_ordered"] = ok
    if strategy in _GROUP_KEY:
        shared = one(
            con,
            f"SELECT count(*) FROM (SELECT {_GROUP_OF_SPLIT_GROUPS[strategy]} AS g FROM split_groups "
            "GROUP BY g HAVING count(DISTINCT split) > 1)",
        )[0]
        checks[f"{strategy}s_in_several_splits"] = shared
        ok = shared == 0
    else:
        ok = checks.get("time_ordered", True)
    checks["disjoint"] = bool(ok)
    if not ok:
        raise PingctlError(f"internal check failed: splits are not disjoint ({checks})")
    return checks


def _split_groups(con, source: str, by_pair: bool = False) -> dict[str, int]:
    """Create `split_groups`: one row per (split, probe key, pair) of the rows of `source` (with
    their split), with its rows, IPv6 rows, failed rows and time span. Every check and statistic
    of the splits is about these groups, so the rows are read for them once, not once per check.
    Returns the rows of each split, a drop reason's ('drop:REASON') included; its groups are left
    out of the table. `by_pair`: `source` has the pair rank `_pair` (regimes), so the rows are
    grouped by two integers and the texts joined to the groups, not to the rows."""
    stats = ("count(*) AS n, count(*) FILTER (WHERE ip_version = 6) AS v6, count(*) FILTER (WHERE rtt = -1.0) "
             "AS failed, min(event_time) AS lo, max(event_time) AS hi")
    if by_pair:
        con.execute(f"""CREATE TEMP TABLE split_groups AS
                        WITH g AS (SELECT split, prb_id, _pair, {stats} FROM {source} GROUP BY ALL)
                        SELECT g.split, COALESCE('prb:' || g.prb_id::VARCHAR, 'src:' || p.src_addr) AS pk,
                               p.src_addr, p.dst_addr, g.n, g.v6, g.failed, g.lo, g.hi
                        FROM g JOIN rg_pairs p ON p.pair_rank = g._pair""")
    else:
        con.execute(f"""CREATE TEMP TABLE split_groups AS SELECT split, {_PROBE_KEY} AS pk, src_addr, dst_addr,
                        {stats} FROM {source} GROUP BY ALL""")
    counts = dict(con.execute("SELECT split, sum(n)::BIGINT FROM split_groups GROUP BY split").fetchall())
    con.execute("DELETE FROM split_groups WHERE split LIKE 'drop:%'")
    return counts


def _split_stats(con, splits: tuple[str, ...]) -> list[dict]:
    # probes: the probe key tells a probe id from an address as COALESCE(prb_id, src_addr) does
    rows = con.execute(
        """SELECT split, sum(n) AS rows, count(DISTINCT pk) AS probes, count(DISTINCT dst_addr) AS destinations,
                  count(DISTINCT (src_addr, dst_addr)) AS pairs, min(lo) AS start, max(hi) AS end,
                  sum(v6) AS v6_rows, sum(failed) / sum(n) AS failure_share
           FROM split_groups GROUP BY split"""
    ).fetchall()
    names = ["split", "rows", "probes", "destinations", "pairs", "start", "end", "v6_rows", "failure_share"]
    by = {r[0]: dict(zip(names, r)) for r in rows}
    return [by.get(s, {"split": s, "rows": 0}) for s in splits]


def shard(
    inputs: list[str | Path],
    out: Path,
    cfg: ShardConfig,
    force: bool = False,
    progress: Progress = _noop,
) -> dict:
    """Split canonical Parquet `inputs` into `out/{train,val,test}/part-NNNNN.parquet`."""
    t0 = time.perf_counter()
    refuse_whole_shard_output(inputs)
    files = resolve_inputs(inputs)
    out = Path(out)
    check_replaceable(out, force, inputs=files)
    total_steps = 4
    with atomic_dir(out) as tmp:
        work = tmp / ".work"
        work.mkdir()
        con = connect(cfg.memory_limit, cfg.threads, temp_dir=work / "spill", database=work / "shard.duckdb")
        progress("validate", 0, total_steps)
        regimes = cfg.strategy == "regimes"
        read, rejected, by_reason = _validate(con, files, tmp / "rejects.jsonl", groups=regimes)
        progress("assign splits", 1, total_steps)
        details = _assign_splits(con, cfg)
        progress("verify", 2, total_steps)
        checks = _verify(con, cfg.strategy)
        files_out, written = _write_splits(con, tmp, splits_of(cfg.strategy), details["shards"], int(cfg.seed),
                                           regimes, progress)
        stats = _split_stats(con, splits_of(cfg.strategy))
        con.close()
        dropped = details["dropped"]
        _reconcile(tmp, files_out, read=read, written=written, rejected=rejected, dropped=sum(dropped.values()))
        import shutil

        shutil.rmtree(work)
        total_rows = max(written, 1)
        for s in stats:
            s["share"] = s["rows"] / total_rows
            s["files"] = len(files_out[s["split"]])
        result = {
            "command": "shard",
            "out": str(out),
            "strategy": cfg.strategy,
            "inputs": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
            "rows_read": read,
            "rows_written": written,
            "rows_rejected": rejected,
            "rejects_by_reason": by_reason,
            # valid rows in no split (only `regimes`: rows that fit no regime), by reason
            "rows_dropped": sum(dropped.values()),
            "dropped_by_reason": dropped,
            "splits": stats,
            "files": files_out,
            "checks": checks,
            "cuts": {k: v for k, v in details.items() if k not in ("rows", "shards", "dropped")},
            "config": cfg.model_dump(),
            "pingctl_version": __version__,
        }
        write_json(tmp / MANIFEST, result)
    result["elapsed_s"] = time.perf_counter() - t0
    result["rows_per_s"] = read / result["elapsed_s"] if result["elapsed_s"] else 0.0
    progress("done", 1, 1)
    return result


def _validate(con, files: list[Path], rejects_path: Path, groups: bool = False) -> tuple[int, int, dict]:
    """Check the inputs (the view `canonical`) and write their rejected rows to `rejects_path`.
    Returns (rows read, rows rejected, rejected by reason); raises when no row is valid.
    `groups`: also create `checked_groups` (rows and first time per reject reason, probe id and
    pair), from the same read of the input: the regimes' labels start from it."""
    canonical_query(con, files)
    if groups:
        con.execute("""CREATE TEMP TABLE checked_groups AS SELECT reject_reason, prb_id, src_addr, dst_addr,
                       count(*) AS n, min(event_time) AS first FROM canonical GROUP BY ALL""")
        counts = con.execute("SELECT reject_reason, sum(n)::BIGINT FROM checked_groups "
                             "GROUP BY 1 ORDER BY 1").fetchall()
    else:
        counts = con.execute("SELECT reject_reason, count(*) FROM canonical GROUP BY 1 ORDER BY 1").fetchall()
    by_reason = {reason: n for reason, n in counts if reason is not None}
    read, rejected = sum(n for _, n in counts), sum(by_reason.values())
    if read and not rejected:
        # the copy below reads every input row twice (checked and raw) to find none
        rejects_path.write_bytes(b"")
        return read, rejected, by_reason
    # `raw` carries the input's own values as text (NaN/inf stay readable JSON strings).
    raw_cols = ", ".join(f"{c} := r.{'_time_raw' if c == 'event_time' else c}::VARCHAR"
                         for c in COLUMNS if c != "prb_id")
    con.execute(
        f"""COPY (SELECT c._file AS file, c._row AS row, c.reject_reason AS reason,
                   struct_pack({raw_cols}) AS raw
                 FROM canonical c JOIN _raw r ON r.filename = c._file AND r.file_row_number = c._row
                 WHERE c.reject_reason IS NOT NULL ORDER BY c._file, c._row)
            TO '{rejects_path}' (FORMAT json)"""
    )
    if read - rejected == 0:
        raise all_rejected(con, files, read)
    return read, rejected, by_reason


def _shard_numbers(tmp: Path, splits: tuple[str, ...], shards: dict[str, int], seed: int):
    """Each shard's file (relative to `tmp`) by split, their paths by shard number (all splits'
    shards numbered in order), and SQL for a row's shard number."""
    files_out: dict[str, list[str]] = {}
    paths: list[Path] = []
    whens = []
    for split in splits:
        files_out[split] = [f"{split}/part-{k:05d}.parquet" for k in range(shards[split])]
        # a split's only shard needs no hash modulo per row to find its rows
        k = f" + hash(src_addr, dst_addr, event_time, rtt, {int(seed)}) % {shards[split]}" if shards[split] > 1 else ""
        whens.append(f"WHEN '{split}' THEN {len(paths)}{k}")
        paths.extend(tmp / f for f in files_out[split])
    return files_out, paths, f"(CASE split {' '.join(whens)} END)::INTEGER"


def _write_splits(con, tmp: Path, splits: tuple[str, ...], shards: dict[str, int], seed: int, by_pair: bool,
                  progress: Progress) -> tuple[dict[str, list[str]], int]:
    """Write the rows of `assigned` as `tmp/SPLIT/part-NNNNN.parquet`, one file per shard, each
    ordered by event_time, src_addr, dst_addr, rtt (`by_pair`: the pair rank `_pair` in place of
    the addresses, which sorts as they do). Returns each split's files (relative to `tmp`) and the
    rows written.

    One sort of every row, its output sent to each row's shard as it comes: a query per shard
    would read every row again for each shard. A sort that starts with the time keeps the
    input's (usually time-ordered) runs and is cheapest; it has every shard's file open at once,
    each holding up to a row group in memory, so past `_OPEN_SHARDS` the rows are sorted by shard
    first and the files written one at a time."""
    import numpy as np

    from pingctl.schema.parquet import ROW_GROUP_ROWS, PartWriters, to_canonical

    files_out, paths, part_sql = _shard_numbers(tmp, splits, shards, seed)
    for split in splits:
        (tmp / split).mkdir()
    by_shard = len(paths) > _OPEN_SHARDS
    order = ("_part, " if by_shard else "") + "event_time, " + ("_pair" if by_pair else "src_addr, dst_addr") + ", rtt"
    total = max(1, int(one(con, "SELECT COALESCE(sum(n), 0) FROM split_groups")[0]))
    progress("sort shards", 3 * total, 4 * total)
    in_splits = ", ".join(f"'{s}'" for s in splits)
    reader = con.sql(f"SELECT {', '.join(COLUMNS)}, {part_sql} AS _part FROM labelled WHERE split IN ({in_splits}) "
                     f"ORDER BY {order}").to_arrow_reader(batch_size=262_144)
    writers = PartWriters(paths, ROW_GROUP_ROWS, arrow_schema())
    done = 0
    try:
        for batch in reader:
            part = batch.column("_part").to_numpy()
            table = to_canonical(batch)
            if by_shard:  # shards before this batch's first are complete
                for p in [p for p in writers.open if p < part[0]]:
                    writers.close(p)
            # stable: each shard's rows keep the sort's order (16-bit keys sort several times faster)
            idx = np.argsort(part.astype(np.uint16) if len(paths) <= 1 << 16 else part, kind="stable")
            cuts = np.flatnonzero(np.diff(part[idx])) + 1
            for lo, hi in zip([0, *cuts], [*cuts, len(idx)]):
                # a copy of the shard's rows: a slice would keep the whole batch in memory until its shard's
                # row group is full
                writers.write(int(part[idx[lo]]), table if hi - lo == len(idx) else table.take(idx[lo:hi]))
            done += len(idx)
            progress("write shards", 3 * total + done, 4 * total)
        written = writers.finish()
    except BaseException:
        writers.abort()
        raise
    finally:
        reader.close()  # DuckDB 2 keeps the result open on the connection until closed
    return files_out, written


def _reconcile(tmp: Path, files_out: dict[str, list[str]], *, read: int, written: int, rejected: int,
               dropped: int) -> None:
    """Reconcile from what is on disk, not from what we meant to write."""
    import pyarrow.parquet as pq

    on_disk = sum(pq.ParquetFile(tmp / f).metadata.num_rows for fs in files_out.values() for f in fs)
    if on_disk != written or written + rejected + dropped != read:
        raise PingctlError(f"row counts do not reconcile: read {read}, written {on_disk}, rejected {rejected}, "
                           f"dropped {dropped} "
                           "(nothing was written; the likeliest cause is a damaged input file, which DuckDB "
                           "can read differently from one query to the next)")


def bench_shard(rows: int, strategies: list[str], memory_limit: str) -> dict:
    """Time `pingctl shard` per strategy on `rows` synthetic rows, each in a child process."""
    import tempfile

    valid = {"time", "probe", "target", "pair", "random", "regimes"}
    bad = [s for s in strategies if s not in valid]
    if bad:
        raise PingctlError(f"unknown strategy {bad}; choose from {sorted(valid)}")
    table = []
    with tempfile.TemporaryDirectory(prefix="pingctl-bench-shard-") as d:
        data = Path(d) / "synth"
        run_measured(["synth", "-o", str(data), "--rows", str(rows)])
        for strategy in strategies:
            res, elapsed, peak = run_measured(
                ["shard", str(data), "-o", str(Path(d) / strategy), "--strategy", strategy,
                 "--memory-limit", memory_limit]
            )
            table.append(
                {
                    "case": strategy,
                    "rows": res["rows_read"],
                    "seconds": round(elapsed, 2),
                    "rows_per_s": int(res["rows_read"] / elapsed),
                    "peak_rss_mb": round(peak, 1),
                    "files": sum(len(v) for v in res["files"].values()),
                }
            )
    return {
        "name": "shard",
        "table": table,
        "memory_limit": memory_limit,
        "notes": ["seconds are wall time of the whole command (start-up, validation, sort, write)"],
    }
