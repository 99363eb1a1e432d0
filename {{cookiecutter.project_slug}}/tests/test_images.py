"""`read_image` on every kind of file a real folder holds: formats, modes, orientation, damage."""

from __future__ import annotations

import math
import re
import struct
import warnings
import zlib
from collections.abc import Callable
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

RED, GREY = (200, 30, 60), (128, 128, 128)
ROTATED = Image.Exif()
ROTATED[0x0112] = 6  # stored rotated: display turned 90 degrees clockwise
CAMERA_EXIF = Image.Exif()
CAMERA_EXIF[0x010F] = "Camera maker"  # Exif data without an orientation


def solid(mode: str, value, size: tuple[int, int] = (20, 12)) -> Image.Image:
    return Image.new(mode, size, value)


def save_rgb(path: Path, **options) -> None:
    jpeg = path.suffix.lower() in (".jpg", ".jpeg")
    solid("RGB", RED).save(path, **({"quality": 100} if jpeg else {}), **options)


def save_fill_bytes(path: Path) -> None:  # any number of 0xFF may come before a marker
    save_rgb(path)
    data = path.read_bytes()
    path.write_bytes(data[:2] + b"\xff" * 5 + data[2:])


def save_animated(path: Path) -> None:
    frames = [solid("RGB", RED).quantize(4), solid("RGB", (0, 0, 255)).quantize(4)]
    frames[0].save(path, save_all=True, append_images=frames[1:])


KINDS = {  # name: (how it is saved, its colour); more kinds in the next test's
    "gray.png": (lambda p: solid("L", 128).save(p), GREY),
    "bilevel.bmp": (lambda p: solid("1", 1).save(p), (255, 255, 255)),
    "palette.png": (lambda p: solid("RGB", RED).quantize(4).save(p, transparency=0), RED),
    "animated.gif": (save_animated, RED),  # palette frames; the first is read
    "rgba.png": (lambda p: solid("RGBA", (*RED, 100)).save(p), RED),
    "rgba.webp": (lambda p: solid("RGBA", (*RED, 50)).save(p, lossless=True), RED),
    "cmyk.jpg": (lambda p: solid("RGB", RED).convert("CMYK").save(p, quality=100), RED),
    # 16-bit grey 128 * 257, the same grey as 8-bit 128
    "gray16.tif": (lambda p: Image.fromarray(np.full((12, 20), 32896, np.uint16)).save(p), GREY),
    "rgb.bmp": (save_rgb, RED),
    "rgb.tiff": (save_rgb, RED),
    "rgb.webp": (lambda p: solid("RGB", RED).save(p, lossless=True), RED),
    # Exif, an ICC profile and a comment: segments before the frame header
    "metadata.jpg": (lambda p: save_rgb(p, exif=CAMERA_EXIF, icc_profile=b"\0" * 3000), RED),
    "fill bytes.jpg": (save_fill_bytes, RED),
    "café ÜNÏCODE 名前.JPEG": (save_rgb, RED),
}


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_reads_as_uint8_rgb(tmp_path: Path, name: str) -> None:
    """The size comes from the header, before any pixel is decoded; exact and approximate."""
    save, colour = KINDS[name]
    path = tmp_path / name
    save(path)
    assert images.image_header(path.read_bytes(), str(path))[:2] == (20, 12)
    for approximate in (False, True):
        image = read_image(str(path), approximate=approximate)
        assert image.dtype == torch.uint8 and image.shape == (3, 12, 20)
        assert image[:, 6, 10].tolist() == pytest.approx(list(colour), abs=4), name


def pil_decode(path: Path) -> torch.Tensor:
    """The reference: PIL's pixels turned as Exif says; 16-bit grey scaled by 1/257, rounded."""
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode.startswith("I;16"):
            grey = np.round(np.asarray(image, np.float64) / 257).astype(np.uint8)
            return torch.from_numpy(grey).expand(3, -1, -1)
        return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)


def noisy_photo(path: Path, size: tuple[int, int] = (64, 48), mode: str = "RGB", **save) -> None:
    """A JPEG (4:2:0 unless told) as cameras give: gradients, a sharp edge, sensor noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([x * 200 / size[0], y * 200 / size[1], 255 - x * 150 / size[0]], axis=-1)
    pixels[:, : size[0] // 2, 0] = 230  # a sharp red edge: where chroma upsampling matters
    pixels[size[1] // 4 : size[1] // 2, size[0] // 4 : size[0] // 2] = 20  # a dark square
    pixels = np.clip(pixels + rng.normal(0, 6, size=pixels.shape), 0, 255)
    image = Image.fromarray(pixels.astype(np.uint8)).convert("L" if mode == "I;16" else mode)
    if mode == "I;16":  # 16-bit grey with levels between the 8-bit ones, as from a scanner
        low = rng.integers(0, 256, (size[1], size[0]), dtype=np.uint16)
        image = Image.fromarray(np.asarray(image, np.uint16) * 256 + low)
    image.save(path, **{"quality": 90, **save})


BIG_ENDIAN_EXIF = b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01" + (
    b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x08\x00\x00" + b"\x00" * 4  # Orientation 8
)


def xmp(orientation: str) -> bytes:
    return f"<x:xmpmeta xmlns:x='adobe:ns:meta/'>{orientation}</x:xmpmeta>".encode()


@pytest.mark.parametrize(
    ("name", "save", "orientation"),
    [
        ("photo.jpg", {}, 1),
        ("444.jpg", {"quality": 95, "subsampling": 0}, 1),
        ("progressive.jpg", {"progressive": True}, 1),
        ("gray.jpg", {"mode": "L"}, 1),
        ("camera.jpg", {"exif": CAMERA_EXIF}, 1),
        ("big endian.jpg", {"exif": BIG_ENDIAN_EXIF}, 8),
        ("beyond.jpg", {"exif": b"Exif\x00\x00II*\x00\xff\xff\xff\x7f"}, 1),  # no directory
        ("xmp.jpg", {"xmp": xmp("")}, 1),  # APP1, but not Exif
        ("xmp 3.jpg", {"xmp": xmp('<r tiff:Orientation="3"/>')}, 3),  # XMP's when Exif has none
        ("both.jpg", {"xmp": xmp("<tiff:Orientation>8</tiff:Orientation>"), "exif": ROTATED}, 6),
        *[(f"turn {turn}.jpg", {"exif": {0x0112: turn}}, turn) for turn in range(1, 9)],
        ("photo.png", {}, 1),
        ("gray16.png", {"mode": "I;16"}, 1),
        ("rotated.png", {"exif": ROTATED}, 6),
        ("rotated.tif", {"exif": ROTATED}, 6),
    ],
)
def test_pixels_and_turns_are_what_pil_gives(
    tmp_path: Path, name: str, save: dict, orientation: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exact decodes equal PIL's; JPEGs' approximate and reduced ones are close, turned alike."""
    path, jpeg = tmp_path / name, name.endswith(".jpg")
    if isinstance(save.get("exif"), dict):
        (exif := Image.Exif()).update(save["exif"])
        save = {"exif": exif}
    noisy_photo(path, **save)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")  # damaged Exif, as decode_image does
        assert not jpeg or images.image_header(path.read_bytes(), "x") == (64, 48, orientation)
        expected = pil_decode(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # damaged Exif data too: nothing to say, the pixels read
        exact, approximate = read_image(str(path)), read_image(str(path), approximate=True)
    assert exact.shape == ((3, 64, 48) if orientation >= 5 else (3, 48, 64))  # turned as told
    assert torch.equal(exact, expected)
    assert approximate.stride() == exact.stride() and torch.equal(approximate, exact) != jpeg
    assert (approximate.int() - exact.int()).abs().float().mean() < 3  # far less than a crop
    turned = (3, 16, 12) if orientation >= 5 else (3, 12, 16)  # a quarter turn swaps the sides
    reduced = turned if jpeg else exact.shape  # only JPEGs are decoded reduced
    assert read_image(str(path), 8).shape == read_image(str(path), 8, True).shape == reduced

    def refuse(*args, **options):  # as simplejpeg does on damage: PIL decodes, the same pixels
        raise ValueError

    monkeypatch.setattr(images.simplejpeg, "decode_jpeg", refuse)
    assert torch.equal(read_image(str(path)), exact)
    assert torch.equal(read_image(str(path), approximate=True), exact)  # no fast path: exact


def jpeg_bomb(path: Path) -> None:
    save_rgb(path)
    data = bytearray(path.read_bytes())
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", 60_000, 60_000)  # 3.6 gigapixels
    path.write_bytes(bytes(data))


def png_bomb(path: Path) -> None:  # a valid 1x1 PNG whose header claims 10 gigapixels
    Image.new("L", (1, 1)).save(path)
    png = bytearray(path.read_bytes())
    header = struct.pack(">II", 100_000, 100_000) + png[24:29]
    png[16:29] = header
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    path.write_bytes(bytes(png))


def other_format(kind: str) -> Callable[[Path], None]:
    def save(path: Path) -> None:
        solid("RGB", RED, (16, 16)).save(path, kind)
        with Image.open(path) as opened:
            assert opened.format == kind  # PIL alone would read it

    return save


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
for kind in ("EPS", "PPM", "PCX", "ICO"):  # PIL reads them (EPS through Ghostscript); we do not
    UNREADABLE[f"{kind}.png"] = (other_format(kind), ": not a known image format")


@pytest.mark.parametrize("name", list(UNREADABLE))
def test_unreadable_files_are_named_read_every_way(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    make, says = UNREADABLE[name]
    make(path)
    refused = "refusing" if "bomb" in name else "cannot read"
    for min_size, approximate in [(None, False), (None, True), (8, False), (8, True)]:
        with pytest.raises(DataError, match=rf"{refused} image .*{re.escape(name)}{says}"):
            read_image(str(path), min_size, approximate)


def test_images_between_pils_warning_and_limit_read_quietly(tmp_path: Path, monkeypatch) -> None:
    """PIL warns from half its limit: images in between read quietly; above, refused."""
    for name in ("rgb.bmp", "reduced.jpg"):
        save_rgb(tmp_path / name)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 150)  # PIL warns above 150 pixels, refuses 300
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        assert read_image(str(tmp_path / "rgb.bmp")).shape == (3, 12, 20)
        assert read_image(str(tmp_path / "reduced.jpg"), 5).shape == (3, 5, 8)  # 3/8
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DataError, match=r"refusing image .*rgb\.bmp: Image size \(240 pixels\)"):
        read_image(str(tmp_path / "rgb.bmp"))


@pytest.fixture(scope="module")
def large_jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("large")
    sizes = {"large": (600, 450), "rotated": (600, 450), "eighths": (750, 600)}
    for name, size in {**sizes, "under twice": (250, 188)}.items():
        exif = {"exif": ROTATED} if name == "rotated" else {}
        noisy_photo(folder / f"{name}.jpg", size, quality=95, **exif)
    Image.new("RGB", (600, 450), RED).save(folder / "large.png")
    return folder


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "fast"])
def test_large_jpeg_is_decoded_at_a_reduced_size_above_min_size(
    large_jpegs: Path, approximate: bool
) -> None:
    def read(name: str, min_size: int) -> torch.Tensor:
        return read_image(str(large_jpegs / f"{name}.jpg"), min_size, approximate)

    reduced = read("large", 112)
    assert reduced.shape == (3, 113, 150)  # 1/4 scale: the largest reduction keeping >= 112
    full = read_image(str(large_jpegs / "large.jpg"))
    shrunk = torch.nn.functional.interpolate(full[None].float(), size=(113, 150), mode="area")[0]
    assert (reduced.float() - shrunk).abs().mean() < 3  # the same picture, not a crop of it
    assert reduced[:, 113 * 3 // 8, 150 * 3 // 8].tolist() == pytest.approx([20, 20, 20], abs=8)
    assert read("rotated", 112).shape == (3, 150, 113)  # turned as Exif says
    assert read("under twice", 112).shape == (3, 188, 250)  # under twice min_size: in full
    assert read("large", 250).shape == (3, 450, 600)
    assert read("eighths", 167).shape == (3, 225, 282)  # 750x600 at libjpeg's 3/8 for 167
    png = read_image(str(large_jpegs / "large.png"), min_size=50)
    assert png.shape == (3, 450, 600)  # a PNG is never reduced


@pytest.mark.parametrize("scale", [(0.6, 1.0), (0.08, 1.0), (0.35, 1.0)])
def test_min_source_size_keeps_every_crop_at_least_the_output_size(scale) -> None:
    crop = RandomResizedCropFlip(224, scale)
    short = crop.min_source_size()
    for height, width in ((short, short * 4 // 3), (short * 4 // 3, short), (short, short)):
        boxes = [crop.crop_box(height, width) for _ in range(2000)]
        assert min(min(h, w) for _, _, h, w in boxes) >= 224 - 1  # - 1: rounding of the box
    # ... and it is not needlessly large: the narrowest crop comes within a few pixels of 224
    assert short < 224 / math.sqrt(scale[0] * 0.75) + 1
