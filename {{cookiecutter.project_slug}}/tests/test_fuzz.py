"""Damaged image files through `read_image` in child processes: none may crash, hang or chatter.

Each source image is mutated in seeded, reproducible ways (`MUTATIONS`), and every mutant read the
four ways of `READS` in a worker process (this file run as a script): a decoder that kills its
process fails the test naming the file. Every read must give a uint8 (3, H, W) tensor or raise
DataError naming the file, and print nothing.
"""

from __future__ import annotations

import importlib
import json
import signal
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

SIZE = (48, 32)
# (min_size, approximate): 8 sends JPEGs through the reduced (DCT-scaled) decode
READS = [(None, False), (None, True), (8, False), (8, True)]
SEED = 14


def photo(flip: bool = False) -> Image.Image:
    """A small photo-like RGB image: gradients, a dark square, noise (so the data is not flat)."""
    width, height = SIZE
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:height, 0:width]
    pixels = np.stack([xs * 255 / width, ys * 255 / height, np.full(xs.shape, 128.0)], axis=-1)
    pixels[height // 4 : height // 2, width // 4 : width // 2] = 20
    pixels = np.clip(pixels + rng.normal(0, 8, pixels.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels[:, ::-1] if flip else pixels)


def save_exif_jpeg(path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: turned 90 degrees clockwise
    photo().save(path, quality=90, exif=exif)


def save_gray16_png(path: Path) -> None:
    Image.fromarray(np.asarray(photo().convert("L"), dtype=np.uint16) * 257).save(path)


def save_animated_gif(path: Path) -> None:
    frames = [photo().quantize(16), photo(flip=True).quantize(16)]
    frames[0].save(path, save_all=True, append_images=frames[1:])


SOURCES: dict[str, Callable[[Path], None]] = {
    "baseline.jpg": lambda p: photo().save(p, quality=90),
    "progressive.jpg": lambda p: photo().save(p, quality=90, progressive=True),
    "exif.jpg": save_exif_jpeg,
    "rgb.png": lambda p: photo().save(p),
    "gray16.png": save_gray16_png,
    "animated.gif": save_animated_gif,
    "rgb.bmp": lambda p: photo().save(p),
    "lossy.webp": lambda p: photo().save(p, quality=80),
    "lossless.webp": lambda p: photo().save(p, lossless=True),
    "raw.tif": lambda p: photo().save(p),
    "lzw.tiff": lambda p: photo().save(p, compression="tiff_lzw"),  # through libtiff
}


# --- mutations: (file bytes, generator) -> damaged bytes ---


def _jpeg_segments(data: bytearray) -> list[tuple[int, int]]:
    """(start, end) of each marker segment before the scan data."""
    segments, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        segments.append((pos, end))
        if data[pos + 1] == 0xDA:  # start of scan: entropy-coded data follows
            break
        pos = end
    return segments


def _png_chunks(data: bytearray) -> list[tuple[int, int]]:
    chunks, pos = [], 8
    while pos + 12 <= len(data):
        end = pos + 12 + int.from_bytes(data[pos : pos + 4], "big")
        chunks.append((pos, end))
        pos = end
    return chunks


def _first_idat(data: bytearray) -> tuple[int, int]:
    return next(c for c in _png_chunks(data) if data[c[0] + 4 : c[0] + 8] == b"IDAT")


def _tiff_ifd(data: bytearray) -> tuple[int, int]:
    """(start, end) of a little-endian TIFF's first image file directory."""
    start = struct.unpack_from("<I", data, 4)[0]
    return start, start + 2 + 12 * struct.unpack_from("<H", data, start)[0] + 4


def _header(data: bytearray) -> tuple[int, int]:
    """The span of the bytes that describe the image, as against those that hold its pixels."""
    if data[:2] == b"\xff\xd8":
        return 0, _jpeg_segments(data)[-1][1]
    if data[:4] == b"\x89PNG":
        return 0, _first_idat(data)[0]
    if data[:4] == b"II*\x00":
        return _tiff_ifd(data)
    return 0, 64  # BMP, GIF (with a 16-colour palette) and WebP headers are about that long


def _flip_bits(data: bytearray, rng: np.random.Generator, start: int, end: int) -> bytearray:
    for _ in range(rng.integers(1, 4)):
        data[rng.integers(start, end)] ^= 1 << int(rng.integers(8))
    return data


def header_bit_flips(data: bytearray, rng: np.random.Generator) -> bytearray:
    return _flip_bits(data, rng, *_header(data))


def body_bit_flips(data: bytearray, rng: np.random.Generator) -> bytearray:
    start, end = _header(data)  # a TIFF's directory may come before its pixels or after them
    return _flip_bits(data, rng, *((8, start) if start > 8 else (end, len(data))))


def random_bytes(data: bytearray, rng: np.random.Generator) -> bytearray:
    places = rng.integers(0, len(data), size=max(4, len(data) // 50))
    for place in places:
        data[place] = int(rng.integers(256))
    return data


def truncated(data: bytearray, rng: np.random.Generator) -> bytearray:
    return data[: rng.integers(1, len(data))]


def zeroed_run(data: bytearray, rng: np.random.Generator) -> bytearray:
    start = int(rng.integers(0, len(data)))
    length = int(rng.integers(4, 257))
    data[start : start + length] = bytes(len(data[start : start + length]))
    return data


def huge_size(data: bytearray, rng: np.random.Generator) -> bytearray:
    """Forge the width and height the header declares (the largest each field holds, or random)."""
    big = int(rng.integers(1 << 13, 1 << 16))
    width, height = [(65535, 65535), (65535, 1), (1, 65535), (0, 0), (big, big)][rng.integers(5)]
    if data[:2] == b"\xff\xd8":
        frame = next(s for s, _ in _jpeg_segments(data) if data[s + 1] in (0xC0, 0xC2))
        struct.pack_into(">HH", data, frame + 5, height, width)
    elif data[:4] == b"\x89PNG":
        if rng.integers(2):
            width, height = width << 15, height << 15  # PNG allows up to 2**31 - 1
        struct.pack_into(">II", data, 16, width, height)
        struct.pack_into(">I", data, 29, zlib.crc32(data[12:29]))  # so that the CRC passes
    elif data[:2] == b"BM":
        struct.pack_into("<ii", data, 18, width, -height if rng.integers(2) else height)
    elif data[:3] == b"GIF":
        struct.pack_into("<HH", data, 6, width, height)  # the screen, then the first frame
        pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
        while pos < len(data) and data[pos] == 0x21:  # extension blocks: sub-blocks to a 0
            pos += 2
            while pos < len(data) and data[pos]:
                pos += data[pos] + 1
            pos += 1
        if pos + 9 <= len(data) and data[pos] == 0x2C:
            struct.pack_into("<HH", data, pos + 5, width, height)
    elif data[8:16] == b"WEBPVP8 ":
        start = data.index(b"\x9d\x01\x2a") + 3
        struct.pack_into("<HH", data, start, width & 0x3FFF, height & 0x3FFF)
    elif data[8:16] == b"WEBPVP8L":
        bits = struct.unpack_from("<I", data, 21)[0] & 0xF0000000
        fields = (width - 1) & 0x3FFF | ((height - 1) & 0x3FFF) << 14
        struct.pack_into("<I", data, 21, bits | fields)
    elif data[:4] == b"II*\x00":
        start, end = _tiff_ifd(data)
        for entry in range(start + 2, end - 4, 12):
            tag, kind = struct.unpack_from("<HH", data, entry)
            if tag in (256, 257):  # ImageWidth, ImageLength: SHORT or LONG
                value = width if tag == 256 else height
                struct.pack_into("<H" if kind == 3 else "<I", data, entry + 8, value)
    return data


def swapped_segments(data: bytearray, rng: np.random.Generator) -> bytearray:
    """Two JPEG marker segments or PNG chunks swapped; two slices of any other format."""
    if data[:2] == b"\xff\xd8":
        parts = _jpeg_segments(data)
    elif data[:4] == b"\x89PNG":
        parts = _png_chunks(data)
    else:
        cuts = sorted(int(c) for c in rng.integers(1, len(data), size=7))
        parts = list(zip([0, *cuts], [*cuts, len(data)], strict=True))
    first, second = sorted(rng.choice(len(parts), size=2, replace=False))
    (a, b), (c, d) = parts[first], parts[second]
    return data[:a] + data[c:d] + data[b:c] + data[a:b] + data[d:]


def empty(data: bytearray, rng: np.random.Generator) -> bytearray:
    return bytearray()


MUTATIONS: dict[str, Callable[[bytearray, np.random.Generator], bytearray]] = {
    "header-bit-flips": header_bit_flips,
    "body-bit-flips": body_bit_flips,
    "random-bytes": random_bytes,
    "truncated": truncated,
    "zeroed-run": zeroed_run,
    "huge-size": huge_size,
    "swapped-segments": swapped_segments,
    "empty": empty,  # one per source: they are all the same
}


def write_mutants(folder: Path, per_kind: int, seed: int = SEED) -> list[Path]:
    """`per_kind` mutants of each source for each mutation, `<source>-<mutation>-<n>.<ext>`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, (name, save) in enumerate(SOURCES.items()):
        source = folder / name
        save(source)
        original = source.read_bytes()
        stem, suffix = name.split(".")
        for m, (kind, mutate) in enumerate(MUTATIONS.items()):
            for n in range(1 if mutate is empty else per_kind):
                rng = np.random.default_rng([seed, s, m, n])
                path = folder / f"{stem}-{kind}-{n:03d}.{suffix}"
                path.write_bytes(bytes(mutate(bytearray(original), rng)))
                paths.append(path)
    return paths


# --- running reads in worker processes ---


@dataclass
class Outcome:
    """What became of one job: the worker's answer, or how the worker died on it."""

    job: list
    answer: list | None  # ["ok", dtype, shape] or ["raised", type name, message]
    died: str | None  # "killed by SIGSEGV", "no answer in 120 s", ...
    stderr: str  # what the worker printed (to stderr, or stdout) while on this job


_MARK = "\x00job "


def serve(handle: Callable[[list], list]) -> None:
    """The worker: JSON jobs `[index, *job]` from stdin, each answered on stdout after a
    `["start", index]` line (and a mark on stderr): which job a dead worker was on, and what
    each job printed."""
    for line in sys.stdin:
        index, *job = json.loads(line)
        print(json.dumps(["start", index]), flush=True)
        print(f"{_MARK}{index}", file=sys.stderr, flush=True)
        try:
            answer = handle(job)
        except Exception as err:  # reported to the parent, which judges it
            answer = ["raised", type(err).__name__, str(err)]
        print(json.dumps(["done", index, answer]), flush=True)


def run_isolated(jobs: list[list], command: list[str], processes: int = 2) -> list[Outcome]:
    """Run `jobs` in workers started with `command` (which calls serve()), spread over
    `processes`; a dead worker's later jobs go to a new one."""
    processes = min(processes, 1 + len(jobs) // 200)  # starting one costs more than 200 reads
    batches = [list(range(len(jobs)))[i::processes] for i in range(processes)]
    outcomes: dict[int, Outcome] = {}
    with ThreadPoolExecutor(processes) as pool:
        for done in pool.map(lambda batch: _run_batch(jobs, batch, command), batches):
            outcomes.update(done)
    return [outcomes[i] for i in range(len(jobs))]


def _run_batch(jobs: list[list], pending: list[int], command: list[str]) -> dict[int, Outcome]:
    outcomes: dict[int, Outcome] = {}
    while pending:
        feed = "".join(json.dumps([i, *jobs[i]]) + "\n" for i in pending)
        limit = 180 + 0.5 * len(pending)  # starting Python and torch: a minute on a busy machine
        worker = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        try:
            out, err = worker.communicate(feed, timeout=limit)
            died = _how_it_died(worker.returncode)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, err = worker.communicate()
            died = f"no answer in {limit:.0f} s"
        started, answers, printed = None, {}, _split_stderr(err)
        for line in out.splitlines():
            try:
                kind, index, *answer = json.loads(line)
            except (ValueError, TypeError):  # not ours: a decoder printed to stdout
                printed[started] = printed.get(started, "") + line + "\n"
                continue
            if kind == "start":
                started = index
            else:
                answers[index] = answer[0]
        if printed.get(None):
            raise RuntimeError(f"the worker printed before any job: {printed[None]}")
        for i in answers:
            outcomes[i] = Outcome(jobs[i], answers[i], None, printed.get(i, ""))
        if started is None or started in answers:
            if len(answers) < len(pending):
                raise RuntimeError(f"the worker stopped ({died}) before its jobs were done")
            break
        outcomes[started] = Outcome(jobs[started], None, died or "exited", printed.get(started, ""))
        pending = pending[pending.index(started) + 1 :]
    return outcomes


def _how_it_died(returncode: int) -> str | None:
    if returncode == 0:
        return None
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


def _split_stderr(err: str) -> dict[int | None, str]:
    """stderr by the job it was printed during (None: before the first)."""
    printed: dict[int | None, str] = {}
    first, *rest = err.split(_MARK)
    if first:
        printed[None] = first
    for part in rest:
        index, _, text = part.partition("\n")
        if text:
            printed[int(index)] = text
    return printed


# --- the read path under test ---


def _read(job: list) -> list:
    from {{ cookiecutter.package_name }}.data.images import read_image
    from {{ cookiecutter.package_name }}.errors import DataError

    path, min_size, approximate = job
    try:
        image = read_image(path, min_size, approximate)
    except DataError as err:
        return ["raised", "DataError", str(err)]
    return ["ok", str(image.dtype), list(image.shape)]


def read_in_workers(paths: list[Path]) -> list[Outcome]:
    """Every file read the four ways of `READS`, each in a worker process."""
    jobs = [[str(path), min_size, approximate] for path in paths for min_size, approximate in READS]
    return run_isolated(jobs, [sys.executable, __file__])


def broken_contract(outcome: Outcome) -> str | None:
    """What is wrong with an outcome, or None if the read kept `read_image`'s contract."""
    path, min_size, approximate = outcome.job
    read = f"{Path(path).name} read with min_size={min_size}, approximate={approximate}"
    if outcome.died:
        return f"{read}: worker {outcome.died}"
    if outcome.stderr:
        return f"{read}: printed {outcome.stderr!r}"
    status, *detail = outcome.answer
    if status == "ok":
        dtype, shape = detail
        if dtype != "torch.uint8" or len(shape) != 3 or shape[0] != 3 or min(shape) < 1:
            return f"{read}: gave a {dtype} tensor of shape {shape}"
        return None
    kind, message = detail
    if kind != "DataError" or path not in message:
        return f"{read}: raised {kind}: {message}"
    return None


def assert_contract_kept(outcomes: list[Outcome]) -> None:
    problems = [problem for problem in map(broken_contract, outcomes) if problem]
    shown = "\n".join(problems[:20])
    assert not problems, f"{len(problems)} of {len(outcomes)} reads went wrong:\n{shown}"


# --- the tests ---


def test_fuzzed_files_never_crash_the_reader(tmp_path: Path) -> None:
    paths = write_mutants(tmp_path / "first", per_kind=3)  # 242 files, 968 reads
    again = write_mutants(tmp_path / "again", per_kind=3)  # reproducible, byte for byte
    assert [p.name for p in paths] == [p.name for p in again]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(paths, again, strict=True))
    originals = {name.split(".")[0]: (tmp_path / "first" / name).read_bytes() for name in SOURCES}
    changed = [p.read_bytes() != originals[p.name.split("-")[0]] for p in paths]
    assert sum(changed) >= 0.95 * len(paths)  # a mutation that did nothing tested nothing
    assert_contract_kept(read_in_workers(paths))


@pytest.mark.slow
def test_fuzzed_files_never_crash_the_reader_at_length(tmp_path: Path) -> None:
    paths = write_mutants(tmp_path, per_kind=14, seed=SEED + 1)  # 1089 files, 4356 reads
    assert len(paths) >= 1000
    assert_contract_kept(read_in_workers(paths))


def test_a_dead_worker_is_named_and_the_rest_still_run(tmp_path: Path) -> None:
    jobs = [["fine"], ["crash"], ["fine"], ["chatter"]]
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_fuzz import serve\n"
        "def handle(job):\n"
        "    if job[0] == 'crash':\n"
        "        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    if job[0] == 'chatter':\n"
        "        os.write(2, b'libpng error: IDAT: incorrect data check\\n')\n"
        "        os.write(1, b'stray\\n')\n"
        "    return ['ok']\n"
        "serve(handle)\n"
    )
    outcomes = run_isolated(jobs, [sys.executable, str(script)], processes=1)
    assert [o.died for o in outcomes] == [None, "killed by SIGSEGV", None, None]
    assert [o.answer for o in outcomes] == [["ok"], None, ["ok"], ["ok"]]
    assert outcomes[3].stderr.splitlines() == ["libpng error: IDAT: incorrect data check", "stray"]


def test_damaged_files_print_nothing(tmp_path: Path) -> None:
    """libjpeg and libpng warn on stderr, naming no file: the reader must keep them quiet."""
    jpeg = tmp_path / "extraneous bytes.jpg"  # "Corrupt JPEG data: 91 extraneous bytes ..."
    photo().save(jpeg, quality=90)
    data = jpeg.read_bytes()
    jpeg.write_bytes(data[:-2] + bytes(range(1, 92)) + data[-2:])
    png = tmp_path / "bit flip.png"  # what killed torchvision's PNG decoder
    photo().save(png)
    data = bytearray(png.read_bytes())
    start, end = _first_idat(data)
    data[start + 208] ^= 0x10
    struct.pack_into(">I", data, end - 4, zlib.crc32(data[start + 4 : end - 4]))  # CRC passes
    png.write_bytes(bytes(data))
    outcomes = read_in_workers([jpeg, png])
    assert_contract_kept(outcomes)  # which includes: nothing on stderr
    assert all(o.answer[0] == "ok" for o in outcomes[:4])  # the JPEG decodes anyway
    assert all(o.answer[:2] == ["raised", "DataError"] for o in outcomes[4:])


if __name__ == "__main__":
    # imported before the first job, so that anything it prints is not blamed on a file
    importlib.import_module("{{ cookiecutter.package_name }}.data.images")
    serve(_read)
