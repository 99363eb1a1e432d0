"""Damaged image files through `read_image` in a worker process (this file run as a script):
each read gives a uint8 (3, H, W) tensor or a DataError naming the file, never kills the process
and prints nothing (libtiff aside). Other tests and a benchmark reuse its mutants and harness."""

from __future__ import annotations

import importlib
import json
import signal
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# (min_size, approximate) for JPEGs, 8: the reduced (DCT-scaled) decode; other formats ignore both
READS = [(None, False), (None, True), (8, False), (8, True)]


def photo(flip: bool = False) -> Image.Image:
    """48x32 of gradients, a dark square, noise: data that is not flat."""
    ys, xs = np.mgrid[0:32, 0:48]
    pixels = np.stack([xs * 255 / 48, ys * 255 / 32, np.full(xs.shape, 128.0)], axis=-1)
    pixels[8:16, 12:24] = 20
    noise = np.random.default_rng(0).normal(0, 8, pixels.shape)
    pixels = np.clip(pixels + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels[:, ::-1] if flip else pixels)


ROTATED = Image.Exif()
ROTATED[0x0112] = 6  # orientation: turned 90 degrees clockwise
GIF2 = photo(flip=True).quantize(16)  # the animated GIF's second frame
SOURCES: dict[str, Callable[[Path], None]] = {
    "baseline.jpg": lambda p: photo().save(p, quality=90),
    "progressive.jpg": lambda p: photo().save(p, quality=90, progressive=True),
    "exif.jpg": lambda p: photo().save(p, quality=90, exif=ROTATED),
    "rgb.png": lambda p: photo().save(p),
    "gray16.png": lambda p: Image.fromarray(np.uint16(photo().convert("L")) * 257).save(p),
    "animated.gif": lambda p: photo().quantize(16).save(p, save_all=True, append_images=[GIF2]),
    "rgb.bmp": lambda p: photo().save(p),
    "lossy.webp": lambda p: photo().save(p, quality=80),
    "lossless.webp": lambda p: photo().save(p, lossless=True),
    "raw.tif": lambda p: photo().save(p),
    "lzw.tiff": lambda p: photo().save(p, compression="tiff_lzw"),  # through libtiff
}


# --- mutations: (file bytes, generator) -> damaged bytes ---


def _jpeg_segments(data: bytearray) -> list[tuple[int, int]]:
    """(start, end) of each marker segment up to the scan's."""
    segments, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        segments.append((pos, pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")))
        if data[pos + 1] == 0xDA:  # start of scan: entropy-coded data follows
            break
        pos = segments[-1][1]
    return segments


def _png_chunks(data: bytearray) -> list[tuple[int, int]]:
    chunks, pos = [], 8
    while pos + 12 <= len(data):
        chunks.append((pos, pos := pos + 12 + int.from_bytes(data[pos : pos + 4], "big")))
    return chunks


def _first_idat(data: bytearray) -> tuple[int, int]:
    return next(c for c in _png_chunks(data) if data[c[0] + 4 : c[0] + 8] == b"IDAT")


def _tiff_ifd(data: bytearray) -> tuple[int, int]:
    """(start, end) of a little-endian TIFF's first image file directory."""
    start = struct.unpack_from("<I", data, 4)[0]
    return start, start + 2 + 12 * struct.unpack_from("<H", data, start)[0] + 4


def _header(data: bytearray) -> tuple[int, int]:
    """The span of the bytes that describe the image, not its pixels."""
    if data[:2] == b"\xff\xd8":
        return 0, _jpeg_segments(data)[-1][1]
    if data[:4] == b"\x89PNG":
        return 0, _first_idat(data)[0]
    # BMP, GIF (with a 16-colour palette) and WebP headers are about 64 bytes long
    return _tiff_ifd(data) if data[:4] == b"II*\x00" else (0, 64)


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
    for place in rng.integers(0, len(data), size=max(4, len(data) // 50)):
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
    """Forge the declared width and height (the largest each field holds, or random)."""
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
        frame = data.index(b"\x2c\0\0\0\0", 13)  # the first frame's descriptor, at (0, 0)
        struct.pack_into("<HH", data, 6, width, height)  # the screen, then the first frame
        struct.pack_into("<HH", data, frame + 5, width, height)
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


MUTATIONS = [header_bit_flips, body_bit_flips, random_bytes, truncated, zeroed_run, huge_size]
MUTATIONS += [swapped_segments, empty]


def write_mutants(folder: Path, per_kind: int, seed: int = 14) -> list[Path]:
    """`per_kind` mutants of each source for each mutation, `<source>-<mutation>-<n>.<ext>`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, (name, save) in enumerate(SOURCES.items()):
        save(source := folder / name)
        original = source.read_bytes()
        stem, suffix = name.split(".")
        for m, mutate in enumerate(MUTATIONS):
            for n in range(1 if mutate is empty else per_kind):
                rng = np.random.default_rng([seed, s, m, n])
                path = folder / f"{stem}-{mutate.__name__.replace('_', '-')}-{n:03d}.{suffix}"
                path.write_bytes(bytes(mutate(bytearray(original), rng)))
                paths.append(path)
    return paths


# --- the harness: jobs in a worker process ---

_MARK = "\x00job "
Outcome = tuple  # (job, answer or None, how the worker died on it or None, what it printed)


def serve(handle: Callable[[list], list]) -> None:
    """The worker: JSON jobs `[index, *job]` from stdin, each announced on stdout and marked on
    stderr before it runs (which job a dead worker was on, what each printed), then answered."""
    for line in sys.stdin:
        index, *job = json.loads(line)
        print(json.dumps(["start", index]), flush=True)
        print(f"{_MARK}{index}", file=sys.stderr, flush=True)
        try:
            answer = handle(job)
        except Exception as err:  # reported to the parent, which judges it
            answer = ["raised", type(err).__name__, str(err)]
        print(json.dumps(["done", index, answer]), flush=True)


def run_isolated(jobs: list[list], command: list[str]) -> list[Outcome]:
    """Run `jobs` in a worker started with `command` (which calls serve()); after a death or a
    hang, the jobs left go to a new one."""
    outcomes: dict[int, Outcome] = {}
    pending = list(range(len(jobs)))
    while pending:
        feed = "".join(json.dumps([i, *jobs[i]]) + "\n" for i in pending).encode()
        limit = 180 + 0.5 * len(pending)  # starting Python and torch: a minute on a busy machine
        try:
            done = subprocess.run(command, input=feed, capture_output=True, timeout=limit)
            out, err, code = done.stdout, done.stderr, done.returncode
            died = f"killed by {signal.Signals(-code).name}" if code < 0 else None
            died = died or (f"exited with code {code}" if code else None)
        except subprocess.TimeoutExpired as hung:
            out, err, died = hung.stdout or b"", hung.stderr or b"", f"no answer in {limit:.0f} s"
        first, *rest = err.decode(errors="replace").split(_MARK)  # by the job printed during
        printed = {None: first} | {int(i): text for i, _, text in (r.partition("\n") for r in rest)}
        started, answers = None, {}
        for line in out.decode(errors="replace").splitlines():
            try:
                kind, index, *answer = json.loads(line)
            except (ValueError, TypeError):  # not ours: a decoder printed to stdout
                printed[started] = printed.get(started, "") + line + "\n"
                continue
            started = index
            if kind == "done":
                answers[index] = answer[0]
        assert not printed[None], f"the worker printed before any job: {printed[None]}"
        outcomes |= {i: (jobs[i], a, None, printed.get(i, "")) for i, a in answers.items()}
        if started is None or started in answers:
            assert len(answers) == len(pending), f"the worker stopped ({died}) before its jobs"
            break
        outcomes[started] = (jobs[started], None, died or "exited", printed.get(started, ""))
        pending = pending[pending.index(started) + 1 :]
    return [outcomes[i] for i in range(len(jobs))]


def _read(job: list) -> list:
    """["ok"] or ["DataError"] if the read kept `read_image`'s contract (a uint8 (3, H, W) tensor
    or a DataError naming the file), else what it gave (serve() answers any other exception)."""
    from {{ cookiecutter.package_name }}.data.images import read_image
    from {{ cookiecutter.package_name }}.errors import DataError

    try:
        image = read_image(*job)
    except DataError as err:
        return ["DataError"] if job[0] in str(err) else ["a DataError without the file", str(err)]
    shape = list(image.shape)
    ok = str(image.dtype) == "torch.uint8" and len(shape) == 3 and shape[0] == 3 and min(shape)
    return ["ok"] if ok else [f"a {image.dtype} tensor of shape {shape}"]


def write_chatty(folder: Path) -> list[Path]:
    """Damage that makes libjpeg and libpng warn on stderr, naming no file."""
    photo().save(jpeg := folder / "extraneous bytes.jpg", quality=90)
    data = jpeg.read_bytes()  # "Corrupt JPEG data: 91 extraneous bytes ..."
    jpeg.write_bytes(data[:-2] + bytes(range(1, 92)) + data[-2:])
    photo().save(png := folder / "bit flip.png")  # what killed torchvision's PNG decoder
    data = bytearray(png.read_bytes())
    start, end = _first_idat(data)
    data[start + 208] ^= 0x10
    struct.pack_into(">I", data, end - 4, zlib.crc32(data[start + 4 : end - 4]))  # CRC passes
    png.write_bytes(bytes(data))
    return [jpeg, png]


@pytest.mark.parametrize(
    ("per_kind", "seed"), [(3, 14), pytest.param(14, 15, marks=pytest.mark.slow)]
)
def test_fuzzed_files_never_crash_the_reader(tmp_path: Path, per_kind: int, seed: int) -> None:
    """242 files, 440 reads (slow: 1089, 1980); each JPEG read the four ways of READS."""
    paths = write_mutants(tmp_path, per_kind, seed)
    originals = {name.split(".")[0]: (tmp_path / name).read_bytes() for name in SOURCES}
    changed = [p.read_bytes() != originals[p.name.split("-")[0]] for p in paths]
    assert sum(changed) >= 0.95 * len(paths)  # a mutation that did nothing tested nothing
    files = [str(p) for p in [*write_chatty(tmp_path), *paths]]
    jobs = [[p, *read] for p in files for read in (READS if p.endswith(".jpg") else READS[:1])]
    outcomes = run_isolated(jobs, [sys.executable, __file__])
    problems = [  # no death, nothing printed (but by libtiff), a tensor or a DataError
        f"{Path(job[0]).name} read with {job[1:]}: {died or printed or answer}"
        for job, answer, died, printed in outcomes
        if died or (printed and ".tif" not in job[0]) or answer not in (["ok"], ["DataError"])
    ]
    shown = "\n".join(problems[:20])
    assert not problems, f"{len(problems)} of {len(outcomes)} reads went wrong:\n{shown}"
    assert [o[1] for o in outcomes[:5]] == [["ok"]] * 4 + [["DataError"]]  # the chatty JPEG, PNG


def test_a_dead_worker_is_named_and_the_rest_still_run(tmp_path: Path) -> None:
    """The harness: a crash, and what a job prints, are told against that job."""
    (script := tmp_path / "worker.py").write_text(
        f"import os, sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_fuzz import serve\n"
        "def handle(job):\n"
        "    if job == ['crash']:\n"
        "        os.kill(os.getpid(), 11)\n"
        "    if job == ['chatter']:\n"
        "        os.write(2, b'libpng error: IDAT\\n'), os.write(1, b'stray\\n')\n"
        "    return ['ok']\n"
        "serve(handle)\n"
    )
    outcomes = run_isolated([["fine"], ["crash"], ["fine"], ["chatter"]], [sys.executable, script])
    assert [o[2] for o in outcomes] == [None, "killed by SIGSEGV", None, None]
    assert [o[1] for o in outcomes] == [["ok"], None, ["ok"], ["ok"]]
    assert outcomes[3][3].splitlines() == ["libpng error: IDAT", "stray"]


if __name__ == "__main__":
    # imported before the first job, so that anything it prints is not blamed on a file
    importlib.import_module("{{ cookiecutter.package_name }}.data.images")
    serve(_read)
