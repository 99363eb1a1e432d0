"""Image decoders fuzzed in child processes: which a damaged file can crash, hang or make talk.

    PYTHONPATH=<bake>/src python benchmarks/fuzz_decoders.py <bake> [--per-kind 40] [--seed 14]
    PYTHONPATH=<bake>/src python benchmarks/fuzz_decoders.py <bake> --speed [--rounds 300]

The mutants are the baked project's own fuzz test's (`<bake>/tests/test_fuzz.py`: seeded bit
flips, random bytes, truncation, zeroed runs, forged sizes, swapped segments, empty files). Each
decoder is given every mutant of the formats it reads, each in a child forked for that one file,
so that a crash is counted rather than fatal. Prints, per decoder, how many files crashed it
(killed by a signal), hung it, made it print to stderr (C libraries) or warn (Python warnings),
were refused with an exception, or decoded. Workers may use 3 GB more address space than they
start with, so that a forged size fails an allocation rather than swamping the machine.

`--speed` times `read_image` (the bake's) against the decode it used before (torchvision's
`decode_image` after the same file read and header check) on a 500x375 photo-like JPEG and PNG
(make_images.py's `photo`): the median of `--rounds` interleaved rounds, on one thread.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import resource
import signal
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

# torchvision.io's decoders: deprecated in 0.29, fuzzed here because they are what the reader used
warnings.filterwarnings("ignore", "The image decoding and encoding", DeprecationWarning)


def _tensor(data: bytes):
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _torchvision(name: str):
    def decode(data: bytes):
        from torchvision import io as tvio

        modes = {"decode_gif": {}, "decode_webp": {"mode": tvio.ImageReadMode.RGB}}
        options = modes.get(name, {"mode": tvio.ImageReadMode.RGB, "apply_exif_orientation": True})
        return getattr(tvio, name)(_tensor(data), **options)

    return decode


def _pil(data: bytes):
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


def _pil_draft(data: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (image.width // 4, image.height // 4))
        return np.asarray(image.convert("RGB"))


def _simplejpeg(fast: bool, min_size: int = 0):
    def decode(data: bytes):
        import simplejpeg

        return simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=fast,
            fastupsample=fast,
            strict=False,  # decode through recoverable damage: more of the decoder runs
            min_height=min_size,
            min_width=min_size,
        )

    return decode


JPEG, PNG, GIF, WEBP = (".jpg", ".jpeg"), (".png",), (".gif",), (".webp",)
ALL = (*JPEG, *PNG, *GIF, *WEBP, ".bmp", ".tif", ".tiff")
DECODERS = {  # name: (the suffixes it reads, decode(bytes))
    "torchvision decode_image": ((*JPEG, *PNG, *GIF, *WEBP), _torchvision("decode_image")),
    "torchvision decode_jpeg": (JPEG, _torchvision("decode_jpeg")),
    "torchvision decode_png": (PNG, _torchvision("decode_png")),
    "torchvision decode_webp": (WEBP, _torchvision("decode_webp")),
    "torchvision decode_gif": (GIF, _torchvision("decode_gif")),
    "PIL (open, exif_transpose, convert RGB)": (ALL, _pil),
    "PIL draft to 1/4 (JPEG)": (JPEG, _pil_draft),
    "simplejpeg exact": (JPEG, _simplejpeg(fast=False)),
    "simplejpeg fastdct+fastupsample": (JPEG, _simplejpeg(fast=True)),
    "simplejpeg fast, scaled to >= 8": (JPEG, _simplejpeg(fast=True, min_size=8)),
}


def _work() -> None:
    """The worker: decode `[decoder, path]` jobs (test_fuzz's protocol)."""
    import simplejpeg  # noqa: F401 - every decoder's library imported once, not in each child
    import torchvision.io  # noqa: F401
    from PIL import Image, ImageOps  # noqa: F401
    from test_fuzz import serve

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) for line in status if line.startswith("VmSize")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + (3 << 30), hard))

    def decode(job: list) -> list:
        name, path = job
        image = DECODERS[name][1](Path(path).read_bytes())
        return ["ok", str(image.dtype), list(image.shape)]

    def handle(job: list) -> list:
        """Decode in a forked child: a crash then costs a fork, not a new worker's imports."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            signal.alarm(30)  # a decoder still at it by then is hung
            try:
                answer = decode(job)
            except Exception as err:
                answer = ["raised", type(err).__name__, str(err)]
            os.write(write, json.dumps(answer).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):
            killer = signal.Signals(os.WTERMSIG(status))
            return ["hung" if killer == signal.SIGALRM else "crashed", killer.name]
        return json.loads(answer)

    serve(handle)


def fuzz(bake: Path, per_kind: int, seed: int) -> None:
    import test_fuzz

    folder = Path(tempfile.mkdtemp(prefix="fuzz_decoders_"))
    paths = test_fuzz.write_mutants(folder, per_kind, seed)
    jobs = [
        [name, str(path)]
        for name, (suffixes, _) in DECODERS.items()
        for path in paths
        if path.suffix in suffixes
    ]
    print(f"{len(paths)} mutants in {folder} (per kind {per_kind}, seed {seed}); {len(jobs)} jobs")
    start = time.perf_counter()
    command = [sys.executable, __file__, str(bake), "--worker"]
    outcomes = test_fuzz.run_isolated(jobs, command)
    print(f"{time.perf_counter() - start:.0f} s")
    counts: dict[str, collections.Counter] = {name: collections.Counter() for name in DECODERS}
    examples: dict[tuple[str, str], str] = {}
    for (name, path), answer, died, stderr in outcomes:  # test_fuzz's Outcome
        status = answer[0] if answer else died
        kind = {"ok": "decoded", "raised": "refused", "crashed": "crashed"}.get(status, "hung")
        if died and "no answer" not in died:
            kind = "crashed"  # the worker itself, not a child
        counts[name][kind] += 1
        counts[name]["files"] += 1
        if kind in ("crashed", "hung"):
            counts[name][f"{kind} on {Path(path).stem.split('-', 1)[1][:-4]}"] += 1
            how = died or f"killed by {answer[1]}"
            examples.setdefault((name, kind), f"{Path(path).name}: {how}")
        for line in stderr.splitlines():  # Python's warnings, or a C library's own
            said = "warned" if re.search(r"\w+Warning: ", line) else "printed"
            if said == "warned" or not line.startswith("  "):  # not a warning's source line
                examples.setdefault((name, said), line.strip())
        if re.search(r"\w+Warning: ", stderr):
            counts[name]["warned"] += 1
        if any(not re.search(r"\w+Warning: |^  ", line) for line in stderr.splitlines()):
            counts[name]["printed"] += 1
    columns = ("files", "crashed", "hung", "printed", "warned", "refused", "decoded")
    print("files that crashed or hung the decoder, made it print to stderr or raise a Python")
    print("warning, it refused with an exception, or it decoded:")
    print(f"{'decoder':42s}" + "".join(f"{c:>8s}" for c in columns))
    for name, count in counts.items():
        print(f"{name:42s}" + "".join(f"{count[c]:8d}" for c in columns))
        mutations = [f"{k.split(' on ')[1]} {v}" for k, v in sorted(count.items()) if " on " in k]
        if mutations:
            print(f"{'':44s}crashed or hung on: {', '.join(mutations)}")
    for (name, said), example in sorted(examples.items()):
        print(f"  {name}, {said}, e.g.: {example[:110]}")


def speed(bake_package: str, rounds: int) -> None:
    import torch
    from torchvision.io import ImageReadMode, decode_image

    sys.path.insert(0, str(Path(__file__).parent))
    from make_images import photo

    images = __import__(f"{bake_package}.data.images", fromlist=["read_image"])
    torch.set_num_threads(1)  # as in a DataLoader worker
    folder = Path(tempfile.mkdtemp(prefix="decode_speed_"))
    paths = {".jpg": folder / "photo.jpg", ".png": folder / "photo.png"}
    picture = photo(0, (500, 375))
    picture.save(paths[".jpg"], quality=90)
    picture.save(paths[".png"])

    def before(path: str) -> torch.Tensor:
        data = bytearray(Path(path).read_bytes())
        images.image_header(data, path)
        encoded = torch.frombuffer(data, dtype=torch.uint8)
        return decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)

    for suffix, path in paths.items():
        readers = {"before: decode_image": before, "now: read_image": images.read_image}
        if suffix == ".jpg":
            readers["now: read_image, approximate"] = lambda p: images.read_image(p, None, True)
        same = torch.equal(before(str(path)), images.read_image(str(path)))
        times: dict[str, list[float]] = {name: [] for name in readers}
        for _ in range(rounds):
            for name, read in readers.items():
                start = time.perf_counter()
                read(str(path))
                times[name].append((time.perf_counter() - start) * 1e3)
        size = path.stat().st_size // 1024
        print(f"500x375 {suffix} ({size} kB), {rounds} rounds; pixels equal: {same}")
        baseline = statistics.median(times["before: decode_image"])
        for name, measured in times.items():
            median = statistics.median(measured)
            print(f"  {name:32s} {median:.3f} ms  ({median / baseline:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bake", type=Path, help="a baked project (its tests/ give the mutants)")
    parser.add_argument("--per-kind", type=int, default=40)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(args.bake / "tests"))
    if args.worker:
        _work()
    elif args.speed:
        package = next(p.name for p in (args.bake / "src").iterdir() if (p / "data").is_dir())
        speed(package, args.rounds)
    else:
        fuzz(args.bake, args.per_kind, args.seed)


if __name__ == "__main__":
    main()
