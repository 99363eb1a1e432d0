"""Serve an exported model over HTTP with LitServe: POST an image, get its top classes as JSON.

`python -m {{ cookiecutter.package_name }} serve --model model.pt2 [--port 8000]` (`--help`: more)

`POST /predict` takes one image, as the body or the file of a multipart form, and answers
`infer`'s top classes for the same file (class names and image size from the model's metadata,
the image decoded and resized as `infer` reads a file). LitServe runs this process, an HTTP
server (uvicorn) and an inference worker, which runs batches of up to `--max_batch_size`
requests. The upload is read, checked and decoded in the HTTP process by `read_upload`, a FastAPI
dependency of the endpoint, so that a bad one is answered 4xx there and never joins a batch:
LitServe (0.2.19) fails every request of a batch when `decode_request` raises for one. SIGTERM
stops the HTTP server first, which answers the requests in flight, then the rest; exit 0.
See docs/inference.md.
"""

import argparse
import asyncio
import functools
import multiprocessing
import os
import signal
import socket
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Annotated

import numpy as np
import torch
from torch import Tensor

from {{ cookiecutter.package_name }}.commands.infer import load_exported, top_classes
from {{ cookiecutter.package_name }}.data.images import UNREADABLE, decode_image, image_header
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError

try:
    import litserve
    from fastapi import Depends, HTTPException, Request
    from starlette.requests import ClientDisconnect
except ImportError:  # the serve extra: main() says how to install it
    litserve = None

API_PATH = "/predict"  # LitServe's default
HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # the ones LitServe accepts
DECODERS = 4  # decodes at a time in an HTTP process, each at most --max_megapixels
MAX_FORM_PARTS = 64  # a form's fields looked at for its file
MIN_BUFFERED = 512 * 2**20  # bytes of uploads an HTTP process holds at once, at least


def _refuse(status: int, sentence: str) -> "HTTPException":
    # The client may still be sending, unread: close; a 503 passes soon, as uploads end.
    headers = {"Connection": "close"} | ({"Retry-After": "1"} if status == 503 else {})
    return HTTPException(status, sentence, headers)


class Upload:
    """What an upload may be, and the reading of one: its bytes within the limits, then its
    uint8 pixels, decoded in a thread. uvicorn has no limit on a body's size or time."""

    def __init__(
        self, image_size: int, max_bytes: int, max_pixels: int, timeout: float, deadline: float
    ) -> None:
        self.image_size, self.max_bytes, self.max_pixels = image_size, max_bytes, max_pixels
        self.timeout, self.deadline = timeout, deadline  # a stall; the whole upload
        # An upload a little over the limit is read to its end (and dropped) before the 413:
        # a client that sends its whole body before it reads (Python's http.client, urllib)
        # would otherwise meet a closed connection instead of the answer.
        self.drain_bytes = max(16 * max_bytes, 256 * 2**20)
        self.budget = max(16 * max_bytes, MIN_BUFFERED)
        self.buffered = 0  # bytes of the uploads held now
        self.transform = eval_transform(image_size)
        self.decoding = asyncio.Semaphore(DECODERS)

    async def __call__(self, request: "Request") -> np.ndarray:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not (media.startswith("image/") or media in _ACCEPTED):
            raise _refuse(415, f"Content-Type {media or '(none)'} is not accepted: {_SEND}")
        body = await self._body(request)
        try:
            async with self.decoding:  # in threads: the server keeps answering meanwhile
                form = request.headers["content-type"] if media == _ACCEPTED[1] else None
                return await asyncio.to_thread(self._pixels, body, form)
        finally:
            self.buffered -= len(body)

    async def _body(self, request: "Request") -> bytearray:
        """The upload, whole; counted in `buffered` until the caller subtracts its length."""
        too_large = f"the upload is larger than --max_upload_mb ({self.max_bytes / 2**20:g} MB)"
        length = request.headers.get("content-length", "")
        declared = int(length) if length.isdigit() else 0
        waits = request.headers.get("expect", "").lower() == "100-continue"  # curl, large bodies
        if declared > self.drain_bytes or (waits and declared > self.max_bytes):
            raise _refuse(413, too_large)  # answered before any of it is read
        loop, chunks = asyncio.get_running_loop(), request.stream()
        ends, body, size = loop.time() + self.deadline, bytearray(), 0
        try:
            while True:
                wait = min(self.timeout, ends - loop.time())
                receiving = asyncio.ensure_future(anext(chunks, None))
                if not (await asyncio.wait({receiving}, timeout=max(wait, 0)))[0]:
                    receiving.cancel()
                    stalled = f"stalled for {self.timeout:g} s (--upload_timeout)"
                    late = f"took over {self.deadline:g} s (--upload_deadline)"
                    raise _refuse(408, f"the upload {late if wait < self.timeout else stalled}")
                try:
                    chunk = receiving.result()
                except ClientDisconnect:
                    raise _refuse(400, "the upload ended before its last byte") from None
                if chunk is None:
                    break
                size += len(chunk)
                if size > self.drain_bytes:
                    raise _refuse(413, too_large)
                if size > self.max_bytes:  # read on to its end, held no longer
                    self.buffered -= len(body)
                    body = bytearray()
                elif self.buffered + len(chunk) > self.budget:
                    raise _refuse(503, "the server holds too many uploads at once: retry shortly")
                else:
                    body += chunk
                    self.buffered += len(chunk)
        except HTTPException:
            self.buffered -= len(body)
            raise
        if size > self.max_bytes:
            raise _refuse(413, too_large)
        return body

    def _pixels(self, body: bytearray, form_type: str | None) -> np.ndarray:
        data, name = _form_file(form_type, body) if form_type else (body, "the request body")
        try:
            width, height, _ = image_header(data, name)
            if width * height > self.max_pixels:
                limit = f"--max_megapixels ({self.max_pixels / 1e6:g})"
                raise DataError(f"refusing image {name}: {width}x{height} is more than {limit}")
            # as infer reads a file: exact decode, a large JPEG reduced no lower than the size
            return self.transform(decode_image(data, name, self.image_size)).numpy()
        except DataError as err:  # a ValueError too: caught first, as it says it all
            raise _refuse(422, str(err)) from None
        except UNREADABLE as err:  # as decode_image says it
            raise _refuse(422, f"cannot read image {name}: {err}") from None


_ACCEPTED = ("application/octet-stream", "multipart/form-data")
_SEND = (
    "send the image as the body, with Content-Type image/jpeg, image/png, ... or "
    "application/octet-stream, or as the file of a multipart/form-data upload"
)


def _form_file(content_type: str, body: bytearray) -> tuple[bytes, str]:
    """The first file of a multipart/form-data body, and its name, by the standard library's
    MIME parser: FastAPI's needs python-multipart, which LitServe does not install. Forms of
    more than `MAX_FORM_PARTS` parts are refused first: the parser makes an object of each."""
    head = Message()
    head["content-type"] = content_type
    boundary = head.get_boundary()
    if not boundary:
        raise _refuse(400, "the multipart/form-data Content-Type has no boundary")
    if body.count(b"--" + boundary.encode("latin-1")) > MAX_FORM_PARTS + 1:
        raise _refuse(400, f"the form has more than {MAX_FORM_PARTS} parts")
    text = b"Content-Type: %s\r\n\r\n%s" % (content_type.encode("latin-1"), body)
    for part in BytesParser(policy=HTTP).parsebytes(text).iter_parts():
        name = part.get_filename()
        if name is not None:  # shown in answers: printable only
            name = "".join(c if c.isprintable() else "?" for c in name[:200])
            return part.get_payload(decode=True), name or "the uploaded file"
    raise _refuse(400, "the form has no file: send the image as a file, as curl -F file=@x.jpg")


async def read_upload(request: "Request") -> np.ndarray:
    """FastAPI's dependency of `API_PATH`: the `Upload` that `main` keeps in the app's state."""
    return await request.app.state.upload(request)


_Pixels = Annotated[np.ndarray, Depends(read_upload)] if litserve else np.ndarray


class ImageClassifierAPI(litserve.LitAPI if litserve else object):
    """The inference worker: `read_upload`'s pixels through the model, in batches, as answers."""

    def __init__(self, model: str, max_batch_size: int, batch_timeout: float) -> None:
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=API_PATH
        )
        self.model_path = model

    def setup(self, device: str) -> None:
        self.model = load_exported(self.model_path)
        self.device = "cpu"
        if device != "cpu" and isinstance(self.model.run, torch.nn.Module):
            self.model.run.to(device)  # an ONNX model stays on onnxruntime's CPU provider
            self.device = device

    def decode_request(self, request: _Pixels) -> Tensor:  # LitServe gives FastAPI the type
        return torch.from_numpy(request)

    def predict(self, images: Tensor) -> Tensor:
        """Probabilities of LitServe's stack of images, or of one image without batching."""
        batch = images if images.dim() == 4 else images[None]
        self.batch_size = len(batch)  # LitServe encodes a batch's answers before the next batch
        probabilities = self.model.probabilities(batch.to(self.device)).cpu()
        return probabilities if images.dim() == 4 else probabilities[0]

    # Not annotated: LitServe would take the annotation as the endpoint's response type.
    def encode_response(self, probabilities: Tensor):
        top = top_classes(probabilities, self.model.class_names)
        top_k = [{"label": label, "probability": p} for label, p in top]
        answer = {"label": top[0][0], "probability": top[0][1], "top_k": top_k}
        return {**answer, "batch_size": self.batch_size}


class _IgnoreSigterm(litserve.Callback if litserve else object):
    """In the inference worker: a SIGTERM to the whole process group (systemd, dumb-init) leaves
    it to answer the requests in flight; LitServe stops it last."""

    def on_before_setup(self, *args, **kwargs) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stop_on_sigterm(main_pid: int, signum: int, frame) -> None:
    """SIGTERM as Ctrl-C: LitServe then stops its HTTP servers first (uvicorn finishes the
    requests in flight, while the inference worker still runs), then the other processes."""
    if os.getpid() != main_pid:  # a child forked from this process
        if multiprocessing.current_process().name.startswith("LitServer-"):
            signal.signal(signum, signal.SIG_DFL)  # an HTTP server, done: uvicorn passes on
            os.kill(os.getpid(), signum)  # the SIGTERM it has answered the requests for
        return  # else LitServe's queue manager: the requests in flight need it
    signal.signal(signum, signal.SIG_IGN)  # one stop at a time
    raise KeyboardInterrupt


def main(args: list[str] | None = None) -> int:
    options = _parser().parse_args(args)
    if litserve is None:
        raise DataError("serve needs LitServe: install the serve extra (pip install '.[serve]')")
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    with socket.socket(family) as probe:  # one line, rather than uvicorn's log and exit code 3
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((options.host, options.port))
        except OSError as err:
            raise DataError(
                f"--port {options.port}: cannot listen on {options.host}: {err.strerror}"
            ) from None
    # loaded here too, so that a bad file stops with one line before any process starts
    image_size = load_exported(options.model).image_size
    api = ImageClassifierAPI(str(options.model), options.max_batch_size, options.batch_timeout)
    server = litserve.LitServer(api, accelerator=options.accelerator, callbacks=[_IgnoreSigterm()])
    server.app.state.upload = Upload(
        image_size,
        int(options.max_upload_mb * 2**20),
        int(options.max_megapixels * 1e6),
        options.upload_timeout,
        options.upload_deadline,
    )
    signal.signal(signal.SIGTERM, functools.partial(_stop_on_sigterm, os.getpid()))
    try:
        server.run(
            host=options.host,
            port=options.port,
            log_level=options.log_level,
            generate_client_file=False,  # it would write client.py where the server is started
        )
    except KeyboardInterrupt:  # before the servers started: no request to finish
        pass
    finally:  # any process LitServe left, as after a SIGTERM before its servers had started
        for child in multiprocessing.active_children():
            child.kill()  # no request in flight; they ignore SIGTERM
            child.join(timeout=10)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} serve",
        description="Serve a model written by export over HTTP: POST /predict an image.",
    )
    add = parser.add_argument
    add("--model", required=True, metavar="FILE", help="model.pt2 or model.onnx")
    add("--host", choices=HOSTS, default=HOSTS[0], help="0.0.0.0: all interfaces")
    add("--port", type=_number(int, 1024, 65535), default=8000, help="1024-65535 (8000)")
    add("--max_batch_size", type=_number(int, 1), default=32, help="images per batch (32)")
    add("--batch_timeout", type=_number(float, 0), default=0.01, help="seconds (0.01)")
    add("--max_upload_mb", type=_number(float, 0.001), default=20, help="largest upload (20)")
    add("--max_megapixels", type=_number(float, 0.001), default=50, help="largest image (50)")
    add("--upload_timeout", type=_number(float, 0.1), default=20, help="seconds a stall (20)")
    add("--upload_deadline", type=_number(float, 0.1), default=60, help="seconds in all (60)")
    add("--accelerator", choices=("auto", "cpu", "cuda"), default="auto")
    add("--log_level", choices=("debug", "info", "warning", "error"), default="info")
    return parser


def _number(kind: type, least: float, most: float = float("inf")):
    def parse(text: str):
        value = kind(text)
        if not least <= value <= most:
            allowed = f"from {least} to {most}" if most < float("inf") else f"at least {least}"
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value"
    return parse
