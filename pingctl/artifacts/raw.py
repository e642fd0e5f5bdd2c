"""Raw RIPE Atlas results on disk (`pingctl ingest`'s input): how a dump file is compressed
(by suffix, else by magic bytes) and whether a file's first bytes look like results. Ingest
reads them; every command that wants a canonical table uses the same facts to point a user
who gives raw results to `pingctl ingest`."""

from __future__ import annotations

# Suffix -> codec. A file without one of these suffixes is sniffed by its magic bytes.
SUFFIX_CODECS = {
    ".bz2": "bz2",
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".xz": "xz",
}
MAGIC = ((b"BZh", "bz2"), (b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"))
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
SNIFF_BYTES = 64 << 10  # a RIPE ping result is well under 1 kB: the first holds a result's keys
RESULT_KEYS = (b'"msm_id"', b'"prb_id"')  # every RIPE Atlas result carries both
BOM = b"\xef\xbb\xbf"


def codec_of(suffix: str, head: bytes) -> str:
    """The codec a file's suffix names, else the one its first bytes name, else "plain"."""
    codec = SUFFIX_CODECS.get(suffix.lower())
    if codec:
        return codec
    return next((name for magic, name in MAGIC if head.startswith(magic)), "plain")


def starts_like_results(text: bytes) -> bool:
    """Whether decoded bytes start a JSON text (lines or an array) that names a result's keys."""
    text = text[:SNIFF_BYTES].removeprefix(BOM).lstrip(b" \t\r\n")
    return text[:1] in (b"{", b"[") and any(k in text for k in RESULT_KEYS)
