"""Every Parquet file pingctl writes carries page checksums, and its pyarrow readers check them."""

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pingctl.errors import PingctlError
from tests.conftest import make_table


def _damage(path: Path, column: str = "rtt") -> None:
    """Flip one byte near the end of `column`'s chunk in the first row group: page data (a page
    header, checked by no CRC, holds min/max statistics, and flipping those changes nothing)."""
    rg = pq.ParquetFile(path).metadata.row_group(0)
    col = next(rg.column(i) for i in range(rg.num_columns) if rg.column(i).path_in_schema == column)
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    raw = bytearray(path.read_bytes())
    raw[end - 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def _pages_fail_their_checksum(path: Path) -> bool:
    try:
        pq.read_table(path, page_checksum_verification=True)
    except OSError as e:
        return "CRC" in str(e)
    return False


def _outputs(tmp_path: Path, synth_dir: Path) -> dict[str, Path]:
    from pingctl.config import IngestConfig
    from pingctl.ingest.core import ingest
    from pingctl.schema.parquet import write_canonical

    write_canonical([make_table(3000)], tmp_path / "canonical.parquet")  # shard's writer
    ripe = Path(__file__).parent / "fixtures" / "ingest" / "firmware-variants.jsonl"
    ingest([ripe], tmp_path / "ingested", IngestConfig(workers=1))
    return {
        "shard": tmp_path / "canonical.parquet",
        "ingest": next((tmp_path / "ingested").glob("*.parquet")),
        "synth": next((synth_dir / "synth").glob("part-*.parquet")),
        "synth truth": synth_dir / "synth" / "truth" / "pairs.parquet",
    }


def test_every_writer_puts_a_checksum_on_every_page(tmp_path, synth_rows):
    for name, path in _outputs(tmp_path, synth_rows).items():
        copy = tmp_path / f"damaged-{name.replace(' ', '-')}.parquet"
        shutil.copy(path, copy)
        column = "rtt" if "rtt" in pq.read_schema(copy).names else pq.read_schema(copy).names[-1]
        _damage(copy, column)
        assert _pages_fail_their_checksum(copy), name


def test_readers_name_a_damaged_file_instead_of_reading_other_numbers(tmp_path):
    from pingctl.artifacts.table import load_split
    from pingctl.schema.parquet import write_canonical

    f = tmp_path / "test.parquet"
    write_canonical([make_table(3000)], f)
    before = load_split(f)["rtt"]
    assert len(before) == 3000
    _damage(f)
    with pytest.raises(PingctlError, match=r"test\.parquet: damaged or unreadable Parquet .*CRC"):
        load_split(f)


def test_sample_outputs_carry_checksums_and_tokenize_checks_them(tmp_path, tiny_run, synth_rows):
    from typer.testing import CliRunner

    from pingctl.cli.app import app

    runner = CliRunner()
    out = tmp_path / "gen.parquet"
    r = runner.invoke(app, ["sample", str(tiny_run), "--n", "2", "--measurements", "3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    _damage(out, "rtt")
    assert _pages_fail_their_checksum(out)
    part = tmp_path / "part.parquet"
    shutil.copy(next((synth_rows / "synth").glob("part-*.parquet")), part)
    _damage(part, "rtt")
    r = runner.invoke(app, ["tokenize", str(part), "--stats"])
    assert r.exit_code == 1 and "part.parquet" in r.output and "CRC" in r.output, r.output


def test_row_groups_are_whole_however_small_the_batches(tmp_path):
    # DuckDB hands shard 122,880 rows at a time: every batch became its own row group
    import pyarrow.parquet as pq

    from pingctl.schema.parquet import write_canonical
    from tests.conftest import make_table

    t = make_table(95)
    batches = [t.slice(i, 7) for i in range(0, 95, 7)]
    f = tmp_path / "g.parquet"
    assert write_canonical(iter(batches), f, row_group_rows=20) == 95
    meta = pq.ParquetFile(f).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [20, 20, 20, 20, 15]
    back = pq.read_table(f)
    assert back.column("rtt").to_pylist() == t.column("rtt").to_pylist()  # order and rows kept
    assert write_canonical(iter([t.slice(0, 40)]), f, row_group_rows=20) == 40
    assert pq.ParquetFile(f).metadata.num_row_groups == 2
