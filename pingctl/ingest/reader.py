"""Streaming input for `pingctl ingest`: decompression, JSON lines and streamed JSON arrays.

Nothing here holds more than a few chunks of a file in memory: a multi-GB daily dump is
read in 1 MiB chunks, split into records, and each record is handed on as raw bytes.

A seekable `.bz2` file is decoded by indexed_bzip2, several blocks at once on as many
threads as `ingest` gives it (`open_parallel_bz2`, `parallel_bz2_chunks`); anything it
does not do exactly like libbzip2 raises `ParallelBz2Failed` and the file is read again
with the `bz2` module (`decoded_chunks`), which stays the reference for damaged files.

`iter_records(read_chunk)` yields blocks `(line0, raws, bad)`; `raws[j]` is on line
`line0 + j` (an empty bytes object is a blank line):
  * `bad is None`      -> each raw is one JSON text (a line of a JSON-lines file, or one
                           element of a top-level JSON array, then alone in its block);
  * `bad is NO_EOL`    -> one raw: the last line, without a trailing newline (if it does
                           not parse, the file was probably cut off);
  * `bad` is a tuple   -> `(reason, detail)` for one raw: a stream-level problem (corrupt or
                           truncated compressed data, a record over the size limit, broken
                           array structure). After `truncated`/`bad_json` at stream level the
                           rest of the file is skipped, so it is one reject, not thousands.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import stat
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from pingctl.artifacts.raw import BOM, JSON_SUFFIXES, SNIFF_BYTES, SUFFIX_CODECS, codec_of, starts_like_results

CHUNK = 1 << 20
MAX_RECORD = 64 << 20  # one RIPE result is < 100 kB; anything this big is not a result

# What a directory scan picks up by name (explicit files and globs are always taken as given);
# any other file there is taken when `looks_like_results` says so.
INPUT_SUFFIXES = JSON_SUFFIXES + (".txt",) + tuple(SUFFIX_CODECS)

NO_EOL = ("no_eol", None)  # sentinel `bad` value: last line without a trailing newline


class HashingReader:
    """Wraps the raw file: counts and hashes every byte read, reports progress."""

    def __init__(self, raw: BinaryIO, on_bytes: Callable[[int], None] | None = None, quiet: int = 0):
        self.raw = raw
        self.sha = hashlib.sha256()
        self.nbytes = 0
        self.on_bytes = on_bytes
        self.quiet = quiet  # the first `quiet` bytes were reported already (a second pass)
        self.name = ""  # GzipFile looks for .name
        self.mode = "rb"

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if data:
            self.sha.update(data)
            self.nbytes += len(data)
            if self.on_bytes is not None and self.nbytes > self.quiet:
                self.on_bytes(min(len(data), self.nbytes - self.quiet))
        return data

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Read (and hash) whatever the decoder left unread, so sha256 covers the file."""
        while self.read(CHUNK):
            pass

    def close(self) -> None:
        self.raw.close()


def detect_codec(path: Path, raw) -> str:
    """Codec from the suffix, else from the magic bytes (`raw` must support peek)."""
    # the suffix first: no peek at a stream whose codec its name gives
    return SUFFIX_CODECS.get(path.suffix.lower()) or codec_of("", raw.peek(8)[:8])


def looks_like_results(path: Path) -> bool:
    """Whether a file a directory walk finds without a known suffix holds RIPE Atlas results
    (daily dumps are often saved without one): decoded with the codec its magic bytes name,
    as a single file given by name is, its first 64 KiB start a JSON text (lines or an array)
    and name a result's keys. A compressed file damaged before that point cannot be told from
    any other binary file and is left out, as a README or a notebook beside the dumps is."""
    try:
        with open(path, "rb") as raw:
            head = b""
            try:
                for chunk in decoded_chunks(detect_codec(path, raw), raw):
                    head += chunk
                    if len(head) >= SNIFF_BYTES:
                        break
            except Exception:  # noqa: BLE001 - any decoder's error on a damaged or foreign file: judge what came out
                pass
    except OSError:
        return False
    return starts_like_results(head)


def open_decoder(codec: str, fileobj):
    """A binary stream of decompressed bytes (errors surface on read)."""
    if codec == "plain":
        return fileobj
    if codec == "bz2":
        import bz2

        return bz2.BZ2File(fileobj)
    if codec == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=fileobj, mode="rb")
    if codec == "xz":
        import lzma

        return lzma.LZMAFile(fileobj)
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(fileobj, read_across_frames=True, closefd=False)
    raise ValueError(f"unknown codec {codec}")


RAW_CHUNK = 256 << 10


def _block_chunks(decompressor_factory, f, out_max: int = CHUNK) -> Iterator[bytes]:
    """Decompress bz2/xz with large input blocks (one GIL release per call, not per 8 KiB
    as BZ2File does), output capped at `out_max` per call; multi-stream files work."""
    d = decompressor_factory()
    started = False  # the current stream has been fed bytes
    while True:
        data = f.read(RAW_CHUNK)
        if not data:
            if started and not d.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            return
        while True:
            if data:
                started = True
            out = d.decompress(data, out_max)
            if out:
                yield out
            if d.eof:
                data = d.unused_data
                d = decompressor_factory()
                started = False
                if not data:
                    break
                continue
            if d.needs_input:
                break
            data = b""


def _frame_chunks(new_decoder, f, unit: str) -> Iterator[bytes]:
    """zstd frames / gzip members one after another, each chunk yielded as soon as it is
    decoded: the lines before a damaged point are kept (GzipFile and zstd's stream reader drop
    the last ~1 MiB before raising), and a file cut inside a frame is an error, never a quiet
    end of file (zstd's stream reader returns EOF there)."""
    d = new_decoder()
    started = False
    while True:
        data = f.read(RAW_CHUNK)
        if not data:
            if started and not d.eof:
                raise EOFError(f"compressed file ended inside a {unit} (cut off?)")
            return
        while data:
            if not started and not data.strip(b"\0"):  # zero padding between/after members
                break
            started = True
            out = d.decompress(data)
            if out:
                yield out
            if not d.eof:
                break
            data, d, started = d.unused_data, new_decoder(), False


def decoded_chunks(codec: str, fileobj) -> Iterator[bytes]:
    """Decompressed chunks of about 1 MiB (errors surface while iterating)."""
    if codec == "bz2":
        import bz2

        yield from _block_chunks(bz2.BZ2Decompressor, fileobj)
        return
    if codec == "xz":
        import lzma

        yield from _block_chunks(lzma.LZMADecompressor, fileobj)
        return
    if codec == "zstd":
        import zstandard

        yield from _frame_chunks(zstandard.ZstdDecompressor().decompressobj, fileobj, "zstd frame")
        return
    if codec == "gzip":
        import zlib

        yield from _frame_chunks(lambda: zlib.decompressobj(wbits=31), fileobj, "gzip member")
        return
    stream = open_decoder(codec, fileobj)
    while True:
        data = stream.read(CHUNK)
        if not data:
            return
        yield data


# ---------------------------------------------------------------- parallel bzip2

BZ2_BLOCK_MAGIC = 0x314159265359  # pi: starts every compressed block
BZ2_EOS_MAGIC = 0x177245385090  # sqrt(pi): ends every stream, followed by the stream CRC


class ParallelBz2Failed(BaseException):
    """indexed_bzip2 met something it does not handle exactly like libbzip2 (a corrupt or
    cut file, trailing bytes): the caller discards what it made from this file and reads
    it again with the `bz2` module, which decides the rows and the reject.

    A BaseException, so that it passes the `except Exception` of `iter_records` (which
    would turn it into a `truncated` reject) and reaches `ingest_file`."""


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def open_parallel_bz2(path: Path, raw, threads: int):
    """An `indexed_bzip2` reader decoding `threads` blocks at once, or None where it cannot
    be used: package missing, not a regular file (a pipe: it needs to seek), or the file
    does not start like a bzip2 stream (left to the `bz2` module, which reports it)."""
    try:
        import indexed_bzip2
    except ImportError:
        return None
    try:
        st = os.fstat(raw.fileno())
        head = raw.peek(10)[:10]
    except (OSError, AttributeError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    if len(head) < 10 or head[:3] != b"BZh" or not 0x31 <= head[3] <= 0x39:
        return None
    if int.from_bytes(head[4:10], "big") not in (BZ2_BLOCK_MAGIC, BZ2_EOS_MAGIC):
        return None
    try:
        return indexed_bzip2.open(str(path), parallelization=max(1, threads))
    except Exception:  # noqa: BLE001 - whatever it is, the bz2 module will say it properly
        return None


def _read_bits(f, bit: int, nbits: int) -> int:
    """`nbits` bits of file `f` starting at bit offset `bit` (big-endian), as an int."""
    nbytes = (bit % 8 + nbits + 7) // 8
    f.seek(bit // 8)
    data = f.read(nbytes)
    if len(data) < nbytes:
        return -1
    return (int.from_bytes(data, "big") >> (nbytes * 8 - bit % 8 - nbits)) & ((1 << nbits) - 1)


def bz2_layout_ok(f, offsets: dict, size: int) -> bool:
    """Whether the block offsets indexed_bzip2 decoded account for the whole file.

    indexed_bzip2 finds blocks by searching for their 48-bit magic and checks each block's
    CRC, but on damaged files it can skip a block whose magic was hit, ignore trailing
    bytes, or stop short without an error. Walk the file the way libbzip2 reads it:
    streams back to back up to the last byte, each `BZh1-9` + blocks + end marker, every
    block one that was decoded, and the stream CRC in the end marker equal to the block
    CRCs folded (so a block that was skipped, or an extra one, is noticed).
    """
    import bisect

    starts = sorted(offsets)
    pos = 0  # byte offset of the next stream
    while pos < size:
        f.seek(pos)
        head = f.read(4)
        if len(head) < 4 or head[:3] != b"BZh" or not 0x31 <= head[3] <= 0x39:
            return False
        bit = (pos + 4) * 8
        combined = 0
        while True:
            word = _read_bits(f, bit, 80)
            if word < 0:
                return False
            magic, crc = word >> 32, word & 0xFFFFFFFF
            if magic == BZ2_EOS_MAGIC:
                if crc != combined:
                    return False
                pos = (bit + 80 + 7) // 8  # a stream ends on a byte boundary
                break
            if magic != BZ2_BLOCK_MAGIC or bit not in offsets:
                return False
            combined = (((combined << 1) | (combined >> 31)) & 0xFFFFFFFF) ^ crc
            k = bisect.bisect_right(starts, bit)
            if k == len(starts):
                return False
            bit = starts[k]
    return pos == size


def parallel_bz2_chunks(reader, path: Path, size: int, on_pos: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """Decompressed chunks of about 1 MiB from an `open_parallel_bz2` reader.

    Raises ParallelBz2Failed on any decoder error, and at the end when `bz2_layout_ok`
    finds the file is not exactly what was decoded; the output is then unusable (it may
    not even be a prefix of what libbzip2 gives). `on_pos(n)`: roughly n compressed bytes
    are behind us (for progress and hashing).
    """
    try:
        while True:
            try:
                data = reader.read(CHUNK)
            except Exception as e:  # noqa: BLE001
                raise ParallelBz2Failed(_err(e)) from None
            if not data:
                break
            if on_pos is not None:
                try:
                    on_pos(reader.tell_compressed() // 8)
                except Exception:  # noqa: BLE001 - progress only
                    pass
            yield data
        try:
            complete = reader.block_offsets_complete()
            offsets = reader.block_offsets()
        except Exception as e:  # noqa: BLE001
            raise ParallelBz2Failed(_err(e)) from None
        with open(path, "rb") as f:
            if not complete or not bz2_layout_ok(f, offsets, size):
                raise ParallelBz2Failed("compressed layout differs from what was decoded")
    finally:
        try:
            reader.close()
        except Exception:  # noqa: BLE001
            pass


class ThreadedChunks:
    """Decompress in a background thread (bz2/zlib/lzma/zstd release the GIL) so parsing
    overlaps decompression. At most `depth` chunks are buffered: memory stays bounded."""

    _END = object()

    def __init__(self, chunks: Iterator[bytes], depth: int = 4):
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.done = False
        self.t = threading.Thread(target=self._run, args=(chunks,), daemon=True)
        self.t.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, chunks: Iterator[bytes]) -> None:
        try:
            for data in chunks:
                if not self._put(data):
                    return
            self._put(self._END)
        except BaseException as e:  # noqa: BLE001 - handed to the reader, raised there
            self._put(e)

    def read(self) -> bytes:
        if self.done:
            return b""
        item = self.q.get()
        if item is self._END:
            self.done = True
            return b""
        if isinstance(item, BaseException):
            self.done = True
            raise item
        return item

    def close(self) -> None:
        self.stop.set()
        self.done = True
        self.t.join(timeout=5)


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------- records


def iter_records(read_chunk: Callable[[], bytes], max_record: int = MAX_RECORD) -> Iterator[tuple]:
    """(line, raw, bad) for every record of a JSON-lines or JSON-array stream."""
    buf = b""
    while True:  # find the first non-blank byte to decide the layout
        try:
            data = read_chunk()
        except Exception as e:  # noqa: BLE001 - any decoder error means a corrupt/truncated file
            yield 1 + buf.count(b"\n"), [buf], ("truncated", _err(e))
            return
        if not data:
            break
        buf += data
        if len(buf) < 3 and BOM.startswith(buf):
            continue  # could still be a byte-order mark
        if buf.startswith(BOM):
            buf = buf[3:]
        if buf.lstrip():
            break
    stripped = buf.lstrip()
    if not stripped:
        return
    if stripped[:1] == b"[":
        yield from _ArraySplitter(buf, read_chunk, max_record).run()
    else:
        yield from _iter_lines(buf, read_chunk, max_record)


def _iter_lines(first: bytes, read_chunk, max_record: int, line1: int = 1) -> Iterator[tuple]:
    line_no = line1 - 1  # lines completed so far
    rest = b""
    skipping = False  # inside an oversized line: drop bytes up to the next newline
    data = first
    while True:
        if data:
            parts = (rest + data if rest else data).split(b"\n")
            rest = parts.pop()
            if skipping and parts:
                parts[0] = b""  # tail of the oversized line, already reported
                skipping = False
            if parts:
                yield line_no + 1, parts, None
                line_no += len(parts)
            if skipping:
                rest = b""
            elif len(rest) > max_record:
                yield line_no + 1, [rest[:4096]], ("too_large", f"line longer than {max_record} bytes; skipped")
                rest = b""
                skipping = True
        try:
            data = read_chunk()
        except Exception as e:  # noqa: BLE001
            yield line_no + 1, [b"" if skipping else rest], ("truncated", _err(e))
            return
        if not data:
            break
    if rest and not skipping:
        yield line_no + 1, [rest], NO_EOL


# A run of bytes outside brackets: plain bytes and complete strings (escapes handled).
_SPAN = re.compile(rb'(?:[^"\[\]{}]+|"[^"\\]*(?:\\.[^"\\]*)*")*', re.S)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR = re.compile(rb'[^,\]\[{}"\s]*')
_WS = re.compile(rb"[ \t\r\n]*")


class _NeedMore(Exception):
    pass


class _ArraySplitter:
    """Incremental splitter of top-level JSON arrays into their elements.

    Tracks strings (with escapes) and bracket depth over chunk boundaries, so one-line
    arrays, pretty-printed arrays and several arrays in a row (API pages) all stream.
    Each element's bytes are yielded unparsed; `orjson` validates them afterwards.
    """

    def __init__(self, buf: bytes, read_chunk, max_record: int):
        self.buf = buf
        self.read_chunk = read_chunk
        self.max_record = max_record
        self.eof = False
        self.error: str | None = None
        self.line = 1  # line number at position `counted`
        self.counted = 0

    def _more(self, keep_from: int) -> int:
        """Append a chunk, dropping bytes before `keep_from`; returns the shift applied."""
        if self.eof:
            raise _NeedMore
        try:
            data = self.read_chunk()
        except Exception as e:  # noqa: BLE001
            self.error = _err(e)
            self.eof = True
            raise _NeedMore from None
        if not data:
            self.eof = True
            raise _NeedMore
        self.line += self.buf.count(b"\n", self.counted, keep_from)
        self.buf = self.buf[keep_from:] + data
        self.counted = 0
        return keep_from

    def _line_at(self, pos: int) -> int:
        self.line += self.buf.count(b"\n", self.counted, pos)
        self.counted = pos
        return self.line

    def _skip_ws(self, pos: int) -> int:
        while True:
            pos = _WS.match(self.buf, pos).end()
            if pos < len(self.buf):
                return pos
            pos -= self._more(pos)

    def _value_end(self, s: int) -> tuple[int, int]:
        """End of the value starting at s (may refill: returns (new start, end))."""
        c = self.buf[s]
        if c in b"{[":
            depth = 0
            i = s
            while True:
                i = _SPAN.match(self.buf, i).end()
                if i >= len(self.buf) or self.buf[i] == 0x22:  # end of data or unterminated string
                    if i - s > self.max_record:
                        raise OverflowError
                    shift = self._more(s)
                    s -= shift
                    i -= shift
                    continue
                if self.buf[i] in b"{[":
                    depth += 1
                else:
                    depth -= 1
                i += 1
                if depth == 0:
                    return s, i
        pat = _STRING if c == 0x22 else _SCALAR
        while True:
            m = pat.match(self.buf, s)
            if m is not None and m.end() < len(self.buf):
                return s, m.end()
            if m is not None and self.eof:
                return s, m.end()
            if len(self.buf) - s > self.max_record:
                raise OverflowError
            s -= self._more(s)

    def run(self) -> Iterator[tuple]:
        pos = 0
        state = "open"  # open: expect '[' or end; first: after '['; next: after a value
        try:
            while True:
                try:
                    pos = self._skip_ws(pos)
                except _NeedMore:
                    if state == "open" and self.error is None:
                        return
                    raise
                c = self.buf[pos]
                if state == "open":
                    if c != 0x5B:  # '['
                        # JSON lines whose first line is an array: go on line by line (this
                        # once skipped the rest of the file as one reject)
                        yield from _iter_lines(self.buf[pos:], self.read_chunk, self.max_record,
                                               self._line_at(pos))
                        return
                    pos += 1
                    state = "first"
                    continue
                if c == 0x5D:  # ']'
                    pos += 1
                    state = "open"
                    continue
                if state == "next":
                    if c != 0x2C:  # ','
                        yield self._line_at(pos), [self.buf[pos : pos + 2000]], (
                            "bad_json",
                            "expected ',' or ']' between array elements; rest of file skipped",
                        )
                        return
                    pos += 1
                    state = "first"  # tolerate a trailing comma before ']'
                    continue
                if c == 0x2C:
                    yield self._line_at(pos), [self.buf[pos : pos + 2000]], (
                        "bad_json",
                        "empty array element; rest of file skipped",
                    )
                    return
                s, e = self._value_end(pos)
                line = self._line_at(s)
                yield line, [self.buf[s:e]], None
                pos = e
                state = "next"
        except _NeedMore:
            # EOF or a decoder error in the middle of the array.
            pos = min(pos, len(self.buf))
            tail = self.buf[pos:]
            detail = self.error or "file ends inside the JSON array (truncated?)"
            yield self._line_at(pos), [tail[:2000].lstrip()], ("truncated", detail)
        except OverflowError:
            yield self._line_at(pos), [self.buf[pos : pos + 4096]], (
                "too_large",
                f"array element longer than {self.max_record} bytes; rest of file skipped",
            )
