"""Reading image files into uint8 RGB tensors: JPEGs through simplejpeg (a file libjpeg warns
about through PIL), the rest through PIL; safety first, speed second (docs/data.md)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import struct
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simplejpeg  # libjpeg-turbo, with its fast IDCT and chroma upsampling selectable
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from {{ cookiecutter.package_name }}.errors import DataError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# PIL decodes these (IMG_EXTENSIONS') only, never its dozens of others: EPS runs Ghostscript.
FORMATS = ("JPEG", "PNG", "BMP", "GIF", "WEBP", "TIFF")
# What PIL raises on damaged files, found by fuzzing (tests/test_fuzz.py): a TIFF tag, a TypeError.
UNREADABLE = (OSError, ValueError, SyntaxError, EOFError, struct.error, TypeError)

# PIL logs an error naming no file on some damaged TIFFs (the DataError names it): dropped.
logging.getLogger("PIL").addHandler(logging.NullHandler())


def read_image(path: str, min_size: int | None = None, approximate: bool = False) -> torch.Tensor:
    """An image file as uint8 RGB (3, H, W), upright (EXIF), first frame, else a DataError naming
    it. A JPEG at least twice `min_size` is decoded reduced; `approximate`: libjpeg's fast IDCT."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise DataError(f"cannot read image {path}: {err}") from err
    return decode_image(data, path, min_size, approximate)


def decode_image(
    data: bytes, path: str, min_size: int | None = None, approximate: bool = False
) -> torch.Tensor:
    """`read_image` for the bytes of a file already read, `path` naming it in errors."""
    with warnings.catch_warnings():  # damaged metadata: PIL's warnings name no file; pixels decode
        warnings.filterwarnings("ignore", module=r"PIL\.")
        try:
            width, height, orientation = image_header(data, path)
            if data[:2] == b"\xff\xd8":
                side = min_size if min_size and min(width, height) >= 2 * min_size else 0
                fast = {"fastdct": approximate, "fastupsample": approximate}
                try:  # the smallest n/8 scale with both sides >= side; ValueError on damage
                    rgb = simplejpeg.decode_jpeg(data, **fast, min_height=side, min_width=side)
                    if orientation >= 5:  # Exif orientation undone, as PIL's exif_transpose
                        rgb = rgb.transpose(1, 0, 2)
                    flip = (orientation - 1) % 4  # none, mirrored, both, upside down
                    rgb = rgb[:: -1 if flip >= 2 else 1, :: -1 if flip in (1, 2) else 1]
                    return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)
                except ValueError:
                    pass  # damaged, or a flaw libjpeg decodes through: PIL decides, in full
            with _open(data) as image:
                return _pil_pixels(image)
        except DataError:
            raise
        except UNREADABLE as err:
            raise DataError(f"cannot read image {path}: {err}") from err


def image_header(data: bytes, path: str) -> tuple[int, int, int]:
    """(width, height, a JPEG's Exif or XMP orientation) from PIL's header parse; empty files,
    unknown formats and decompression bombs (PIL's limit) refused before any pixel is decoded."""
    if not data:
        raise DataError(f"cannot read image {path}: the file is empty")
    try:
        with _open(data) as header:
            orientation = header.getexif().get(0x0112, 1) if header.format == "JPEG" else 1
            return (*header.size, orientation if orientation in range(1, 9) else 1)
    except Image.DecompressionBombError as err:
        raise DataError(f"refusing image {path}: {err}") from err
    except UnidentifiedImageError as err:
        raise DataError(f"cannot read image {path}: not a known image format") from err


def warn_if_small(path: Callable[[int], str], count: int, size: int, seed: int) -> None:
    """Warn when most of 32 training images drawn with `seed` are under `size`; headers only."""
    sizes, files = [], [path(i) for i in np.random.default_rng(seed).permutation(count)[:32]]
    for file in filter(os.path.isfile, files):  # not a named pipe, which would hold the reader
        with contextlib.suppress(Image.DecompressionBombError, *UNREADABLE), _open(file) as im:
            sizes.append(im.size)  # an unreadable file: the loader or `scan` names it
    if len(small := [(w, h) for w, h in sizes if min(w, h) < size]) > len(sizes) / 2:
        width, height = np.median(small, axis=0).astype(int)
        print(
            f"warning: {len(small)} of {len(sizes)} sampled training images are smaller than "
            f"--data.image_size {size} (median {width}x{height}): training upsamples them; "
            f"consider --data.image_size {max(8, min(width, height))}",
            file=sys.stderr,
        )


def _open(data: bytes | str) -> Image.Image:
    """A PIL image over `data` or a file; PIL's bomb warning silenced (its error names the file)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(data if isinstance(data, str) else io.BytesIO(data), formats=FORMATS)


def _pil_pixels(image: Image.Image) -> torch.Tensor:
    ImageOps.exif_transpose(image, in_place=True)
    if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit grayscale (TIFF, PNG)
        pixels = np.asarray(image, dtype=np.float32)
        if image.mode != "I" or pixels.max(initial=0) > 255:
            pixels = pixels / 257
        gray = np.clip(pixels.round(), 0, 255).astype(np.uint8)
        return torch.from_numpy(gray).expand(3, -1, -1).clone()
    if image.mode == "P":  # via RGBA, so that a transparent palette entry converts cleanly
        image = image.convert("RGBA")
    rgb = np.array(image if image.mode == "RGB" else image.convert("RGB"))
    return torch.from_numpy(rgb).permute(2, 0, 1)
