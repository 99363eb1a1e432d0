"""Reading image files into uint8 RGB tensors: which decoder reads which file, and why."""

from __future__ import annotations

import io
import math
import os
import struct
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from {{ cookiecutter.package_name }}.errors import DataError

try:
    # Deprecated since torchvision 0.29 in favour of TorchCodec, and due to be removed. Without
    # it every file goes through PIL: the same pixels, a slower decode (BENCHMARKS.md).
    from torchvision.io import ImageReadMode, decode_image
except ImportError:  # pragma: no cover - a torchvision without its image decoders
    decode_image = None
try:
    import simplejpeg  # libjpeg-turbo, with its fast IDCT and chroma upsampling selectable
except ImportError:  # pragma: no cover - a dependency, but training works without it
    simplejpeg = None

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
# torchvision's decoders (libjpeg-turbo, libpng, libwebp) are faster than PIL for these; the rest
# (BMP, TIFF) are only readable through PIL.
_TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif")
# PIL's own hard limit (twice its warning threshold): about 13k x 13k pixels, 0.5 GB as RGB.
MAX_IMAGE_PIXELS = 2 * 89_478_485


def read_image(path: str, min_size: int | None = None, approximate: bool = False) -> torch.Tensor:
    """Read an image file as a uint8 RGB tensor of shape (3, H, W), EXIF orientation applied.

    Grayscale, palette, RGBA (alpha dropped), CMYK and 16-bit images are all converted to 8-bit RGB;
    an animated GIF or WebP gives its first frame.

    `min_size`: the short side the caller needs. A JPEG at least twice that is decoded at 1/2, 1/4
    or 1/8 scale in libjpeg's DCT domain (`PIL.Image.draft`), keeping the short side >= `min_size`:
    2000x1500 photos to a 256 short side took 90 ms against 130-197 ms for a full decode and resize
    (BENCHMARKS.md). Below twice `min_size` nothing can be reduced, and torchvision's decoder
    (libjpeg-turbo, into a tensor) is faster than PIL's: 1.5 ms against 1.9 ms for a 500x375 photo.

    `approximate`: for training. A JPEG is decoded with libjpeg-turbo's fast integer IDCT and fast
    chroma upsampling (`simplejpeg`, which also does the reduction above, at any n/8 scale): 0.53
    ms against 0.61 ms for a noisy 500x375 photo, and cold training epochs about 10% faster on 2
    CPUs (BENCHMARKS.md). Pixels differ from the exact decode by 1.2-1.3 levels on average, up to
    ~60 at a few sharp colour edges: far less than random crops change, but not what a model
    should be evaluated or served on, so validation, prediction and the pixel cache decode
    exactly. JPEGs with Exif data take the exact path too, which applies their orientation.

    Raises:
        DataError: naming the file, when it cannot be decoded or declares more than
            `MAX_IMAGE_PIXELS` pixels.
    """
    try:
        data = _read_bytes(path)
        width, height, exif = _check_header(data, path)
        jpeg = data[:2] == b"\xff\xd8"
        reducible = jpeg and bool(min_size) and min(width, height) >= 2 * min_size
        if approximate and jpeg and not exif and simplejpeg is not None:
            try:
                return _decode_jpeg_fast(data, min_size if reducible else 0)
            except ValueError:
                pass  # damaged, or a recoverable flaw that `strict` refuses: the exact path decides
        if reducible:
            try:
                return _decode_jpeg_reduced(data, min(width, height) / min_size)
            except (OSError, ValueError, SyntaxError):
                pass  # the full decode below reports what is wrong with the file
        if decode_image is not None and path.lower().endswith(_TORCHVISION_EXTENSIONS):
            try:
                return _decode_with_torchvision(data)
            except RuntimeError:
                pass  # PIL reads some files libjpeg/libpng refuse, and words its errors better
        return _decode_with_pil(data)
    except DataError:
        raise
    except (RuntimeError, OSError, ValueError, SyntaxError) as err:
        raise DataError(f"cannot read image {path}: {err}") from err


def _read_bytes(path: str) -> bytearray:
    with open(path, "rb") as file:
        data = bytearray(os.fstat(file.fileno()).st_size)
        file.readinto(data)
    return data


def _check_header(data: bytearray, path: str) -> tuple[int, int, bool]:
    """(width, height, whether it is a JPEG with Exif data), refusing empty files, unknown formats
    and decompression bombs first."""
    if not data:
        raise DataError(f"cannot read image {path}: the file is empty")
    jpeg = _jpeg_header(data)
    if jpeg:
        width, height, exif = jpeg
    else:
        width, height = _png_size(data) or _pil_size(data, path)
        exif = False
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(
            f"refusing image {path}: {width}x{height} pixels is more than MAX_IMAGE_PIXELS "
            f"({MAX_IMAGE_PIXELS}): a decompression bomb, or far larger than training needs"
        )
    return width, height, exif


# JPEG start-of-frame markers (the frame header holds the size): 0xC0-0xCF but for DHT (0xC4),
# JPG (0xC8) and DAC (0xCC). Markers without a length field: TEM, RST0-7, SOI, EOI.
_JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_BARE_MARKERS = frozenset({0x01, *range(0xD0, 0xDA)})
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _jpeg_header(data: bytearray) -> tuple[int, int, bool] | None:
    """(width, height, has Exif) from a JPEG's header; None if not a JPEG or no frame header.

    Our own marker walk rather than `PIL.Image.open`, which parses every header segment in
    Python: 0.25-0.3 ms of the ~1.9 ms it takes to read a 500x375 photo, for three facts. Exif
    data, in an APP1 segment, comes before the frame header.
    """
    if data[:2] != b"\xff\xd8":
        return None
    pos = 2
    exif = False
    while pos + 9 <= len(data):
        if data[pos] != 0xFF:
            return None  # not at a marker: damaged; PIL's parser words the error
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
        elif marker in _JPEG_FRAME_MARKERS:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return (width, height, exif) if width and height else None
        elif marker in _JPEG_BARE_MARKERS:
            pos += 2
        elif marker == 0xDA:  # start of scan before any frame header
            return None
        else:
            exif = exif or (marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00")
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return None


def _png_size(data: bytearray) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, which the format requires to come first."""
    if data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR" or len(data) < 24:
        return None
    return struct.unpack_from(">II", data, 16)


def _open(data: bytearray) -> Image.Image:
    """A PIL image over `data`, its header parsed and its pixels not yet decoded.

    PIL's DecompressionBombWarning is silenced: `_check_header` applies our own limit, with a
    message naming the file (PIL's own error, at twice its warning size, still propagates).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(io.BytesIO(data))


def _pil_size(data: bytearray, path: str) -> tuple[int, int]:
    """(width, height) of any format PIL knows, from the header only."""
    try:
        with _open(data) as header:
            return header.size
    except Image.DecompressionBombError as err:
        raise DataError(f"refusing image {path}: {err}") from err
    except UnidentifiedImageError as err:
        raise DataError(f"cannot read image {path}: not a known image format") from err


def _decode_with_torchvision(data: bytearray) -> torch.Tensor:
    encoded = torch.frombuffer(data, dtype=torch.uint8)
    image = decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    if image.ndim == 4:  # animated GIF: all frames
        image = image[0]
    if image.dtype != torch.uint8:  # 16-bit PNG
        image = (image.float() / 257).round().to(torch.uint8)
    return image


def _decode_jpeg_fast(data: bytearray, min_size: int = 0) -> torch.Tensor:
    """(3, H, W) over libjpeg-turbo's (H, W, 3) output, as torchvision's decoder returns it.

    With `min_size`, scaled in the DCT domain to the smallest of libjpeg's n/8 sizes whose sides
    are both at least `min_size`: 6.2 ms against 6.9 ms for `_decode_jpeg_reduced` on a 2000x1500
    photo (BENCHMARKS.md).
    """
    rgb = simplejpeg.decode_jpeg(
        data,
        colorspace="RGB",
        fastdct=True,
        fastupsample=True,
        min_height=min_size,
        min_width=min_size,
    )
    return torch.from_numpy(rgb).permute(2, 0, 1)


def _decode_jpeg_reduced(data: bytearray, scale: float) -> torch.Tensor:
    """Decode a JPEG at the largest DCT reduction (1/2, 1/4, 1/8) that is at most 1/`scale`."""
    with _open(data) as image:
        width, height = image.size
        image.draft("RGB", (math.ceil(width / scale), math.ceil(height / scale)))
        image = ImageOps.exif_transpose(image).convert("RGB")
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def _decode_with_pil(data: bytearray) -> torch.Tensor:
    with _open(data) as image:
        image = ImageOps.exif_transpose(image)
        if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit grayscale (TIFF, PNG)
            pixels = np.asarray(image, dtype=np.float32)
            if image.mode != "I" or pixels.max(initial=0) > 255:
                pixels = pixels / 257
            gray = np.clip(pixels.round(), 0, 255).astype(np.uint8)
            return torch.from_numpy(np.ascontiguousarray(gray)).expand(3, -1, -1).clone()
        if image.mode == "P":  # via RGBA, so that a transparent palette entry converts cleanly
            image = image.convert("RGBA")
        rgb = np.asarray(image.convert("RGB")).copy()
        return torch.from_numpy(rgb).permute(2, 0, 1)
