"""`read_image` on every kind of file a real folder holds: formats, modes, orientation, damage."""

from __future__ import annotations

import math
import os
import re
import struct
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_corrupt
from PIL import Image, ImageOps

from {{ cookiecutter.package_name }}.data import images
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import RandomResizedCropFlip
from {{ cookiecutter.package_name }}.errors import DataError

RED = (200, 30, 60)


def solid(mode: str, value, size: tuple[int, int] = (20, 12)) -> Image.Image:
    return Image.new(mode, size, value)


def save_rgba(path: Path) -> None:
    solid("RGBA", (*RED, 100)).save(path)


def save_palette(path: Path) -> None:
    image = solid("RGB", RED).quantize(4)
    image.save(path, transparency=0)


def save_cmyk(path: Path) -> None:
    solid("RGB", RED).convert("CMYK").save(path, quality=100)


def save_gray16(path: Path) -> None:
    Image.fromarray(np.full((12, 20), 128 * 257, dtype=np.uint16)).save(path)


def save_rgb(path: Path) -> None:
    solid("RGB", RED).save(path, **({"quality": 100} if path.suffix.lower() == ".jpg" else {}))


KINDS = {
    "gray.png": (lambda p: solid("L", 128).save(p), (128, 128, 128)),
    "bilevel.bmp": (lambda p: solid("1", 1).save(p), (255, 255, 255)),
    "palette.png": (save_palette, RED),
    "palette.gif": (lambda p: solid("RGB", RED).quantize(4).save(p), RED),
    "rgba.png": (save_rgba, RED),
    "rgba.webp": (lambda p: solid("RGBA", (*RED, 50)).save(p, lossless=True), RED),
    "cmyk.jpg": (save_cmyk, RED),
    "gray16.png": (save_gray16, (128, 128, 128)),
    "gray16.tif": (save_gray16, (128, 128, 128)),
    "rgb.bmp": (save_rgb, RED),
    "rgb.tiff": (save_rgb, RED),
    "rgb.webp": (lambda p: solid("RGB", RED).save(p, lossless=True), RED),
    "UPPER CASE.JPG": (save_rgb, RED),
    "café ünïcode 名前.jpeg": (save_rgb, RED),
}


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "approximate"])
@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_reads_as_uint8_rgb(tmp_path: Path, name: str, approximate: bool) -> None:
    save, colour = KINDS[name]
    path = tmp_path / name
    save(path)
    image = read_image(str(path), approximate=approximate)
    assert image.dtype == torch.uint8 and image.shape == (3, 12, 20)
    centre = image[:, 6, 10].tolist()
    assert centre == pytest.approx(list(colour), abs=4), f"{name}: {centre}"


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "approximate"])
@pytest.mark.parametrize("suffix", [".jpg", ".png", ".tif"])
def test_exif_orientation_is_applied(tmp_path: Path, suffix: str, approximate: bool) -> None:
    image = Image.new("RGB", (40, 30), RED)
    image.paste((0, 0, 255), (0, 0, 10, 30))  # a blue band down the left edge
    exif = image.getexif()
    exif[0x0112] = 6  # stored rotated: display turned 90 degrees clockwise
    path = tmp_path / f"rotated{suffix}"
    image.save(path, exif=exif)
    read = read_image(str(path), approximate=approximate)
    assert read.shape == (3, 40, 30)
    assert read[2, 2, 15] > 200 and read[0, 2, 15] < 60  # the band is now along the top
    assert read[0, 35, 15] > 150


def torchvision_decode(path: Path) -> torch.Tensor | None:
    """torchvision's decoders as the reference for a JPEG or PNG (deprecated since 0.29, and a
    damaged PNG could kill them, so `read_image` does not use them); None once they are gone."""
    try:
        from torchvision.io import ImageReadMode, decode_image
    except ImportError:  # pragma: no cover
        return None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        image = decode_image(str(path), mode=ImageReadMode.RGB, apply_exif_orientation=True)
    return image if image.dtype == torch.uint8 else (image.float() / 257).round().byte()


def pil_decode(path: Path) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Corrupt EXIF data", UserWarning)
        with Image.open(path) as image:
            rgb = np.array(ImageOps.exif_transpose(image).convert("RGB"))
    return torch.from_numpy(rgb).permute(2, 0, 1)


def save_photo(path: Path, **options) -> None:
    rng = np.random.default_rng(0)
    photo = np.clip(rng.normal(120, 40, size=(48, 64, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(photo).save(path, **options)


ROTATED_EXIF = Image.Exif()
ROTATED_EXIF[0x0112] = 6

EXACT = {
    "photo.jpg": {"quality": 90},
    "444.jpg": {"quality": 95, "subsampling": 0},
    "progressive.jpg": {"quality": 90, "progressive": True},
    "rotated.jpg": {"exif": ROTATED_EXIF},
    "photo.png": {},
}


@pytest.mark.parametrize("name", [*EXACT, "gray.jpg", "gray16.png"])
def test_exact_pixels_are_what_torchvision_and_pil_give(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / name
    if name == "gray.jpg":
        solid("L", 128, (64, 48)).save(path)
    elif name == "gray16.png":
        save_gray16(path)
    else:
        save_photo(path, **EXACT[name])
    image = read_image(str(path))
    before = torchvision_decode(path)
    assert before is None or torch.equal(image, before)
    if name != "gray16.png":  # PIL's own 16-to-8-bit conversion truncates
        assert torch.equal(image, pil_decode(path))
    monkeypatch.setattr(images, "simplejpeg", None)  # JPEGs through PIL: the same pixels
    assert torch.equal(read_image(str(path)), image)


def noisy_photo(path: Path, size: tuple[int, int] = (64, 48), **save) -> None:
    """A JPEG (4:2:0, quality 90) as cameras give: colour gradients, a sharp edge, sensor noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([x * 200 / size[0], y * 200 / size[1], 255 - x * 150 / size[0]], axis=-1)
    pixels[:, : size[0] // 2, 0] = 230  # a sharp red edge: where chroma upsampling matters
    pixels = np.clip(pixels + rng.normal(0, 6, size=pixels.shape), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90, **save)


def test_approximate_decode_is_close_to_the_exact_one(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "photo.jpg"
    noisy_photo(path)
    exact = read_image(str(path))
    approximate = read_image(str(path), approximate=True)
    assert approximate.shape == exact.shape == (3, 48, 64)
    assert approximate.stride() == exact.stride()  # the same layout for the transforms
    difference = (approximate.int() - exact.int()).abs()
    # a level or two on average: far less than a random crop changes
    assert difference.float().mean() < 3
    assert difference.max() > 0  # it did take libjpeg's fast path, which is not exact
    monkeypatch.setattr(images, "simplejpeg", None)  # without it: the exact decode
    assert torch.equal(read_image(str(path), approximate=True), exact)


CAMERA_EXIF = Image.Exif()
CAMERA_EXIF[0x010F] = "Camera maker"
BIG_ENDIAN_EXIF = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01" + (
    b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x08\x00\x00" + b"\x00" * 4  # Orientation 8
)


def xmp(orientation: str) -> bytes:
    return f"<x:xmpmeta xmlns:x='adobe:ns:meta/'>{orientation}</x:xmpmeta>".encode()


@pytest.mark.parametrize(
    ("save", "orientation"),
    [
        ({}, 1),
        ({"exif": CAMERA_EXIF}, 1),  # Exif data without an orientation
        ({"exif": ROTATED_EXIF}, 6),
        ({"exif": BIG_ENDIAN_EXIF}, 8),
        ({"exif": b"Exif\x00\x00II*\x00\xff\xff\xff\x7f"}, 1),  # directory beyond the data
        ({"xmp": xmp("")}, 1),  # APP1, but not Exif
        ({"xmp": xmp('<r tiff:Orientation="3"/>')}, 3),  # PIL reads XMP's when Exif has none
        ({"xmp": xmp("<tiff:Orientation>8</tiff:Orientation>"), "exif": ROTATED_EXIF}, 6),
    ],
)
def test_jpeg_header_reads_the_orientation(tmp_path: Path, save: dict, orientation: int) -> None:
    path = tmp_path / "photo.jpg"
    noisy_photo(path, **save)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")  # damaged Exif, as decode_image does
        header = images.image_header(bytearray(path.read_bytes()), "x")
    assert header == (64, 48, orientation)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # damaged Exif data too: nothing to say, the pixels read
        exact = read_image(str(path))
        approximate = read_image(str(path), approximate=True)  # Exif or not: the fast decode
    assert torch.equal(exact, pil_decode(path))
    assert approximate.shape == exact.shape and not torch.equal(approximate, exact)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_orientation_turns_as_pil_turns_it(tmp_path: Path, orientation: int) -> None:
    path = tmp_path / "photo.jpg"
    exif = Image.Exif()
    exif[0x0112] = orientation
    noisy_photo(path, exif=exif)
    exact = read_image(str(path))
    assert torch.equal(exact, pil_decode(path))
    approximate = read_image(str(path), approximate=True)
    assert (approximate.int() - exact.int()).abs().float().mean() < 3
    turned = (3, 16, 12) if orientation >= 5 else (3, 12, 16)  # a quarter turn swaps the sides
    assert read_image(str(path), 8).shape == read_image(str(path), 8, True).shape == turned


@pytest.mark.parametrize("kind", ["EPS", "PPM", "PCX", "ICO"])
def test_only_the_formats_of_img_extensions_are_decoded(tmp_path: Path, kind: str) -> None:
    """PIL knows dozens of formats (EPS runs Ghostscript); a file named .png holding one of
    those others is no image here, as for a file of no known format."""
    path = tmp_path / f"{kind}.png"
    solid("RGB", RED, (16, 16)).save(path, kind)
    with Image.open(path) as opened:
        assert opened.format == kind  # PIL alone would read it
    with pytest.raises(DataError, match=rf"{kind}\.png: not a known image format"):
        read_image(str(path))


def test_tiffs_decoded_in_threads_leave_stderr_where_it_was(tmp_path: Path) -> None:
    """Each TIFF decode sends stderr to a file of its own and back: two at once must not leave
    the process's stderr in the other's (deleted) file."""
    path = tmp_path / "small.tif"
    solid("RGB", RED, (8, 8)).save(path)
    before = os.fstat(2)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: read_image(str(path)), range(400)))
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_libtiff_output_is_told_in_the_error_not_printed(tmp_path: Path, capfd) -> None:
    path = tmp_path / "damaged.tiff"
    solid("RGB", RED, (48, 32)).save(path, compression="tiff_lzw")  # read through libtiff
    data = bytearray(path.read_bytes())
    data[8:24] = bytes(16)  # the start of the compressed pixels: an LZW code libtiff refuses
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"cannot read image .*damaged\.tiff: .*\(libtiff: .+\)"):
        read_image(str(path))
    assert capfd.readouterr().err == ""


def bomb_png(path: Path, width: int, height: int) -> None:
    """A valid 1x1 PNG whose header then claims `width` x `height`: tiny on disk, huge decoded."""
    png = bytearray(path.read_bytes())
    header = struct.pack(">II", width, height) + png[24:29]
    png[16:29] = header
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    path.write_bytes(bytes(png))


def save_jpeg_with_metadata(path: Path) -> None:
    """EXIF, an ICC profile and a comment: segments that come before the frame header."""
    exif = Image.new("RGB", (1, 1)).getexif()
    exif[0x0112] = 6
    profile = b"\0" * 3000  # content is not parsed for the size
    solid("RGB", RED).save(path, exif=exif, icc_profile=profile, comment=b"made by a test")


def save_jpeg_with_fill_bytes(path: Path) -> None:
    """JPEG allows any number of 0xFF fill bytes before a marker."""
    save_rgb(path)
    data = path.read_bytes()
    path.write_bytes(data[:2] + b"\xff" * 5 + data[2:])


HEADERS = {
    "baseline.jpg": save_rgb,
    "progressive.jpg": lambda p: solid("RGB", RED).save(p, progressive=True, optimize=True),
    "gray.jpg": lambda p: solid("L", 128).save(p),
    "cmyk.jpg": save_cmyk,
    "metadata.jpg": save_jpeg_with_metadata,
    "fill bytes.jpg": save_jpeg_with_fill_bytes,
    "rgb.png": save_rgb,
    "gray16.png": save_gray16,
}


@pytest.mark.parametrize("name", list(HEADERS))
def test_size_from_header_matches_the_image(tmp_path: Path, name: str) -> None:
    """The size is read from the header, before any pixel is decoded."""
    path = tmp_path / name
    HEADERS[name](path)
    data = bytearray(path.read_bytes())
    assert images.image_header(data, str(path))[:2] == (20, 12)
    assert read_image(str(path)).shape[0] == 3


def jpeg_bomb(path: Path) -> None:
    save_rgb(path)
    data = bytearray(path.read_bytes())
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", 60_000, 60_000)  # 3.6 gigapixels
    path.write_bytes(bytes(data))


def png_bomb(path: Path) -> None:
    """A valid 1x1 PNG whose header then claims 10 gigapixels (30 GB as RGB)."""
    Image.new("L", (1, 1)).save(path)
    png = bytearray(path.read_bytes())
    header = struct.pack(">II", 100_000, 100_000) + png[24:29]
    png[16:29] = header
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    path.write_bytes(bytes(png))


UNREADABLE = {  # name: (how it is made, what the error says after the file's name)
    "cut short.jpg": (write_corrupt, r": .*(?i:truncated)"),  # 64x48: also reduced at min_size 8
    "empty.png": (lambda p: p.write_bytes(b""), ": the file is empty"),
    "text.png": (lambda p: p.write_bytes(b"not a picture"), ": not a known image format"),
    "text.tif": (lambda p: p.write_bytes(b"II*\x00 not really a tiff"), ": "),
    "soi.jpg": (lambda p: p.write_bytes(b"\xff\xd8"), ": "),  # damaged JPEG headers: PIL decides
    "sos.jpg": (lambda p: p.write_bytes(b"\xff\xd8\xff\xda\x00\x02"), ": "),
    "junk.jpg": (lambda p: p.write_bytes(b"\xff\xd8junk" * 4), ": "),
    "bomb.jpg": (jpeg_bomb, r": .*3600000000 pixels"),
    "bomb.png": (png_bomb, r": "),
}


@pytest.mark.parametrize("name", list(UNREADABLE))
def test_unreadable_files_are_named_read_every_way(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    make, says = UNREADABLE[name]
    make(path)
    refused = "refusing" if "bomb" in name else "cannot read"
    for min_size, approximate in [(None, False), (None, True), (8, False), (8, True)]:
        with pytest.raises(DataError, match=rf"{refused} image .*{re.escape(name)}{says}"):
            read_image(str(path), min_size, approximate)


def test_pixel_limit_is_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.jpg"
    save_rgb(path)
    monkeypatch.setattr(images, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DataError, match=r"big\.jpg: 20x12 pixels is more than MAX_IMAGE_PIXELS"):
        read_image(str(path))


@pytest.mark.parametrize(("name", "min_size"), [("rgb.bmp", None), ("reduced.jpg", 5)])
def test_only_our_pixel_limit_speaks(tmp_path: Path, monkeypatch, name: str, min_size) -> None:
    """PIL warns from half our limit: images in between read quietly."""
    path = tmp_path / name
    save_rgb(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # PIL warns above 150 pixels, we allow 240
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = read_image(str(path), min_size)
    assert image.shape == ((3, 12, 20) if min_size is None else (3, 6, 10))


def test_animated_gif_gives_its_first_frame(tmp_path: Path) -> None:
    path = tmp_path / "anim.gif"
    frames = [solid("RGB", RED).quantize(4), solid("RGB", (0, 0, 255)).quantize(4)]
    frames[0].save(path, save_all=True, append_images=frames[1:])
    image = read_image(str(path))
    assert image.shape == (3, 12, 20)
    assert image[:, 6, 10].tolist() == pytest.approx(list(RED), abs=4)


def photo_like(path: Path, size: tuple[int, int], **save) -> None:
    """A smooth gradient with a dark square, saved as a JPEG."""
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    pixels = np.stack([xs * 255 // width, ys * 255 // height, np.full_like(xs, 128)], axis=-1)
    pixels[height // 4 : height // 2, width // 4 : width // 2] = 20
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=95, **save)


@pytest.mark.parametrize("approximate", [False, True], ids=["PIL draft", "simplejpeg"])
def test_large_jpeg_is_decoded_at_a_reduced_size_above_min_size(
    tmp_path: Path, approximate: bool
) -> None:
    exif = Image.new("RGB", (1, 1)).getexif()
    exif[0x0112] = 6  # displayed turned 90 degrees clockwise
    sizes = {"large": (1200, 900), "rotated": (1200, 900), "eighths": (1500, 1200)}
    sizes["under twice"] = (500, 375)
    for name, size in sizes.items():
        photo_like(tmp_path / f"{name}.jpg", size, **({"exif": exif} if name == "rotated" else {}))

    def read(name: str, min_size: int) -> torch.Tensor:
        return read_image(str(tmp_path / f"{name}.jpg"), min_size, approximate)

    reduced = read("large", 224)
    assert reduced.shape == (3, 225, 300)  # 1/4 scale: the largest reduction keeping >= 224
    full = read_image(str(tmp_path / "large.jpg"))
    shrunk = torch.nn.functional.interpolate(full[None].float(), size=(225, 300), mode="area")[0]
    assert (reduced.float() - shrunk).abs().mean() < 3  # the same picture, not a crop of it
    assert reduced[:, 225 * 3 // 8, 300 * 3 // 8].tolist() == pytest.approx([20, 20, 20], abs=8)
    assert read("rotated", 224).shape == (3, 300, 225)  # turned as Exif says
    assert read("under twice", 224).shape == (3, 375, 500)  # under twice min_size: in full
    assert read("large", 500).shape == (3, 900, 1200)
    # 1500x1200 for a 334 short side: libjpeg's 3/8 gives 450; PIL's powers of two stop at 1/2
    assert read("eighths", 334).shape == ((3, 450, 563) if approximate else (3, 600, 750))
    Image.new("RGB", (1200, 900), RED).save(tmp_path / "large.png")  # a PNG is never reduced
    assert read_image(str(tmp_path / "large.png"), min_size=100).shape == (3, 900, 1200)


@pytest.mark.parametrize("scale", [(0.6, 1.0), (0.08, 1.0), (0.35, 1.0)])
def test_min_source_size_keeps_every_crop_at_least_the_output_size(scale) -> None:
    crop = RandomResizedCropFlip(224, scale)
    short = crop.min_source_size()
    for height, width in ((short, short * 4 // 3), (short * 4 // 3, short), (short, short)):
        boxes = [crop.crop_box(height, width) for _ in range(2000)]
        assert min(min(h, w) for _, _, h, w in boxes) >= 224 - 1  # - 1: rounding of the box
    # ... and it is not needlessly large: the narrowest crop comes within a few pixels of 224
    assert short < 224 / math.sqrt(scale[0] * 0.75) + 1
