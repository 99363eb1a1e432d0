"""`read_image` on every kind of file a real folder holds: formats, modes, orientation, damage."""

from __future__ import annotations

import math
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_corrupt
from PIL import Image

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


def test_without_torchvision_decoders_pil_gives_the_same_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torchvision.io's decoders are deprecated and due to be removed: PIL must stand in for them
    rng = np.random.default_rng(0)
    photo = np.clip(rng.normal(120, 40, size=(48, 64, 3)), 0, 255).astype(np.uint8)
    exif = Image.new("RGB", (1, 1)).getexif()
    exif[0x0112] = 6
    files = {"photo.jpg": {"quality": 90}, "rotated.jpg": {"exif": exif}, "photo.png": {}}
    for name, options in files.items():
        Image.fromarray(photo).save(tmp_path / name, **options)
    with_torchvision = {name: read_image(str(tmp_path / name)) for name in files}
    monkeypatch.setattr(images, "decode_image", None)
    for name in files:
        assert torch.equal(read_image(str(tmp_path / name)), with_torchvision[name]), name


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "approximate"])
@pytest.mark.parametrize("min_size", [None, 8])  # 8: through the reduced (1/2 .. 1/8) decode
def test_truncated_jpeg_names_the_file(tmp_path: Path, min_size, approximate: bool) -> None:
    path = tmp_path / "cut short.jpg"
    write_corrupt(path)  # 64x48
    with pytest.raises(DataError, match=r"(?i)cannot read image .*cut short\.jpg: .*truncated"):
        read_image(str(path), min_size, approximate)


def noisy_photo(path: Path, size: tuple[int, int] = (64, 48), **save) -> None:
    """A JPEG (4:2:0, quality 90) as cameras give: colour gradients, a sharp edge, sensor noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([x * 200 / size[0], y * 200 / size[1], 255 - x * 150 / size[0]], axis=-1)
    pixels[:, : size[0] // 2, 0] = 230  # a sharp red edge: where chroma upsampling matters
    pixels = np.clip(pixels + rng.normal(0, 6, size=pixels.shape), 0, 255)
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90, **save)


def test_approximate_decode_is_close_to_the_exact_one(tmp_path: Path) -> None:
    path = tmp_path / "photo.jpg"
    noisy_photo(path)
    exact = read_image(str(path))
    approximate = read_image(str(path), approximate=True)
    assert approximate.shape == exact.shape == (3, 48, 64)
    assert approximate.stride() == exact.stride()  # the same layout for the transforms
    difference = (approximate.int() - exact.int()).abs()
    assert difference.float().mean() < 3  # 1.9 here; 1.3 on benchmarks/make_images.py's
    assert difference.max() > 0  # it did take libjpeg's fast path, which is not exact


def test_approximate_decode_without_simplejpeg_is_the_exact_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "photo.jpg"
    noisy_photo(path)
    monkeypatch.setattr(images, "simplejpeg", None)
    assert torch.equal(read_image(str(path), approximate=True), read_image(str(path)))


CAMERA_EXIF = Image.Exif()
CAMERA_EXIF[0x010F] = "Camera maker"


@pytest.mark.parametrize(
    ("save", "exif"),
    [
        ({}, False),
        ({"exif": CAMERA_EXIF}, True),  # Exif data without an orientation: still exact
        ({"xmp": b"<x:xmpmeta xmlns:x='adobe:ns:meta/'/>"}, False),  # APP1, but not Exif
    ],
)
def test_jpeg_header_tells_exif_apart(tmp_path: Path, save: dict, exif: bool) -> None:
    path = tmp_path / "photo.jpg"
    noisy_photo(path, **save)
    data = bytearray(path.read_bytes())
    assert images._jpeg_header(data) == (64, 48, exif)
    approximate = read_image(str(path), approximate=True)
    assert torch.equal(approximate, read_image(str(path))) == exif


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.png", b"", "empty"),
        ("text.png", b"this is not a picture", "not a known image format"),
        ("text.tif", b"II*\x00 not really a tiff", "cannot read image"),
    ],
)
def test_unreadable_files_name_the_file(tmp_path: Path, name: str, content: bytes, reason: str):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"{name}.*{reason}|{reason}.*{name}"):
        read_image(str(path))


def bomb_png(path: Path, width: int, height: int) -> None:
    """A valid 1x1 PNG whose header then claims `width` x `height`: tiny on disk, huge decoded."""
    png = bytearray(path.read_bytes())
    header = struct.pack(">II", width, height) + png[24:29]
    png[16:29] = header
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    path.write_bytes(bytes(png))


def test_decompression_bomb_is_refused_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    Image.new("L", (1, 1)).save(path)
    bomb_png(path, 100_000, 100_000)  # 10 gigapixels: 30 GB as RGB
    with pytest.raises(DataError, match=r"refusing image .*bomb\.png"):
        read_image(str(path))


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
    """The fast header parsers read the size from the bytes, without PIL."""
    path = tmp_path / name
    HEADERS[name](path)
    data = bytearray(path.read_bytes())
    assert (images._jpeg_header(data) or images._png_size(data))[:2] == (20, 12)
    assert read_image(str(path)).shape[0] == 3


@pytest.mark.parametrize("content", [b"\xff\xd8", b"\xff\xd8\xff\xda\x00\x02", b"\xff\xd8junk" * 4])
def test_damaged_jpeg_header_falls_back_to_pil(tmp_path: Path, content: bytes) -> None:
    assert images._jpeg_header(bytearray(content)) is None
    path = tmp_path / "damaged.jpg"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"cannot read image .*damaged\.jpg"):
        read_image(str(path))


def test_jpeg_decompression_bomb_is_refused_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "bomb.jpg"
    save_rgb(path)
    data = bytearray(path.read_bytes())
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", 60_000, 60_000)  # 3.6 gigapixels
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"refusing image .*bomb\.jpg: 60000x60000 pixels"):
        read_image(str(path))


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
    path = tmp_path / "large.jpg"
    photo_like(path, (1200, 900))
    reduced = read_image(str(path), min_size=224, approximate=approximate)
    assert reduced.shape == (3, 225, 300)  # 1/4 scale: the largest reduction keeping >= 224
    full = read_image(str(path))
    assert full.shape == (3, 900, 1200)
    shrunk = torch.nn.functional.interpolate(full[None].float(), size=(225, 300), mode="area")[0]
    assert (reduced.float() - shrunk).abs().mean() < 3  # the same picture, not a crop of it
    assert reduced[:, 225 * 3 // 8, 300 * 3 // 8].tolist() == pytest.approx([20, 20, 20], abs=8)


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "approximate"])
def test_reduced_decode_applies_exif_orientation(tmp_path: Path, approximate: bool) -> None:
    path = tmp_path / "large rotated.jpg"
    exif = Image.new("RGB", (1, 1)).getexif()
    exif[0x0112] = 6  # displayed turned 90 degrees clockwise
    photo_like(path, (1200, 900), exif=exif)
    assert read_image(str(path), 224, approximate).shape == (3, 300, 225)
    assert read_image(str(path)).shape == (3, 1200, 900)


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "approximate"])
@pytest.mark.parametrize(("size", "min_size"), [((500, 375), 224), ((1200, 900), 500)])
def test_jpeg_under_twice_min_size_is_decoded_in_full(
    tmp_path: Path, size, min_size, approximate: bool
) -> None:
    path = tmp_path / "photo.jpg"
    photo_like(path, size)
    read = read_image(str(path), min_size=min_size, approximate=approximate)
    assert read.shape == (3, size[1], size[0])


def test_approximate_reduction_takes_the_smallest_eighth_above_min_size(tmp_path: Path) -> None:
    # 1500x1200 for a 334 short side: 3/8 gives 450; PIL's powers of two stop at 1/2 (600)
    path = tmp_path / "photo.jpg"
    photo_like(path, (1500, 1200))
    assert read_image(str(path), min_size=334).shape == (3, 600, 750)
    assert read_image(str(path), min_size=334, approximate=True).shape == (3, 450, 563)


def test_png_is_never_reduced(tmp_path: Path) -> None:
    path = tmp_path / "large.png"
    Image.new("RGB", (1200, 900), RED).save(path)
    assert read_image(str(path), min_size=100).shape == (3, 900, 1200)


@pytest.mark.parametrize("scale", [(0.6, 1.0), (0.08, 1.0), (0.35, 1.0)])
def test_min_source_size_keeps_every_crop_at_least_the_output_size(scale) -> None:
    crop = RandomResizedCropFlip(224, scale)
    short = crop.min_source_size()
    for height, width in ((short, short * 4 // 3), (short * 4 // 3, short), (short, short)):
        boxes = [crop.crop_box(height, width) for _ in range(2000)]
        assert min(min(h, w) for _, _, h, w in boxes) >= 224 - 1  # - 1: rounding of the box
    # ... and it is not needlessly large: the narrowest crop comes within a few pixels of 224
    assert short < 224 / math.sqrt(scale[0] * 0.75) + 1
