"""Serve an exported model over HTTP with LitServe: POST an image, get its top classes as JSON.

`python -m {{ cookiecutter.package_name }} serve --model model.pt2 [--port 8000]` (`--help`: more)

`POST /predict` takes one image, as the body or the file of a multipart form, and answers
`infer`'s top classes for the same file: the model's metadata gives the class names and image
size, and the image is decoded and resized as `infer` reads a file. LitServe runs this process,
an HTTP server (uvicorn) and an inference worker, which holds the model and runs batches of up
to `--max_batch_size` requests, waiting at most `--batch_timeout` s to fill one. Uploads are
checked and decoded in the HTTP process (`UploadGuard`), so that a bad one is answered 4xx there
and never joins a batch: LitServe (0.2.19) fails every request of a batch when `decode_request`
raises for one. SIGTERM stops the HTTP server first, which answers the requests in flight, then
the rest (which ignore a SIGTERM to the whole process group); exit 0. See docs/inference.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import multiprocessing
import os
import signal
import socket
from email.message import Message
from email.utils import collapse_rfc2231_value

import torch
from torch import Tensor

from {{ cookiecutter.package_name }}.commands.infer import load_exported, top_classes
from {{ cookiecutter.package_name }}.data.images import UNREADABLE, decode_image, image_header
from {{ cookiecutter.package_name }}.data.transforms import eval_transform
from {{ cookiecutter.package_name }}.errors import DataError

try:
    import litserve
except ImportError:  # an optional extra: main() says how to install it
    litserve = None

API_PATH = "/predict"  # LitServe's default
HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # the ones LitServe accepts
# Decodes at a time in an HTTP process; each image at most --max_megapixels (50: about 0.4 GB
# while decoding), so that large images that are not bombs bound the memory too.
DECODERS = 4
MAX_FORM_HEAD = 4096  # bytes of a form part's headers, read as text only up to this
MAX_FORM_PARTS = 64  # a form's parts looked at for its file
# Uploads held at once by an HTTP process, at least: more are answered 503 until some finish.
MIN_BUFFERED = 512 * 2**20


class Refused(Exception):
    """An upload answered with an HTTP `status` and one sentence, before it reaches the model."""

    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status


class UploadGuard:
    """ASGI middleware of the HTTP process: an image upload to `API_PATH` becomes the uint8
    pixels the model takes (as JSON, which LitServe passes on), or is answered 4xx."""

    def __init__(
        self,
        app,
        *,
        image_size: int,
        max_bytes: int,
        max_pixels: int,
        timeout: float,
        deadline: float,
    ) -> None:
        self.app = app
        self.image_size = image_size
        self.max_bytes = max_bytes
        # An upload a little over the limit is read to its end (and dropped) before the 413:
        # a client that sends its whole body before it reads (Python's http.client, urllib)
        # would otherwise meet a closed connection instead of the answer.
        self.drain_bytes = max(16 * max_bytes, 256 * 2**20)  # dropped as read: no memory held
        self.max_pixels = max_pixels
        self.timeout = timeout  # seconds without a byte
        self.deadline = deadline  # seconds for the whole upload: a slow one is cut too
        self.budget = max(16 * max_bytes, MIN_BUFFERED)
        self.buffered = 0  # bytes of the uploads held now
        self.transform = eval_transform(image_size)
        self.decoding: asyncio.Semaphore | None = None  # made in the server's own event loop

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != API_PATH or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        content_type = headers.get("content-type", "")
        body = bytearray()
        try:
            form = _is_form(content_type)
            body = await self._body(headers, receive)
            pixels = await self._decode(body, content_type if form else None)
        except Refused as refused:
            return await _answer(send, refused.status, str(refused))
        finally:
            self.buffered -= len(body)
        encoded = base64.b64encode(pixels.numpy().tobytes()).decode("ascii")
        payload = json.dumps({"pixels": encoded}).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in _BODY_HEADERS]
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def replay() -> dict:  # the pixels, then what the client sends next: its disconnect
            return messages.pop() if messages else await receive()

        await self.app({**scope, "headers": headers}, replay, send)

    async def _body(self, headers: dict[str, str], receive) -> bytearray:
        """The upload, whole; counted in `buffered` until the caller subtracts its length."""
        too_large = f"the upload is larger than --max_upload_mb ({self.max_bytes / 2**20:g} MB)"
        length = headers.get("content-length", "")
        declared = int(length) if length.isdigit() else 0
        waits = headers.get("expect", "").lower() == "100-continue"  # curl, for large bodies
        if declared > self.drain_bytes or (waits and declared > self.max_bytes):
            raise Refused(413, too_large)  # answered before any of it is read
        stalled = f"the upload stalled for {self.timeout:g} s (--upload_timeout)"
        late = f"the upload took over {self.deadline:g} s (--upload_deadline)"
        body, size = bytearray(), 0
        ends = asyncio.get_running_loop().time() + self.deadline
        try:
            while True:
                wait = min(self.timeout, ends - asyncio.get_running_loop().time())
                receiving = asyncio.ensure_future(receive())
                if not (await asyncio.wait({receiving}, timeout=max(wait, 0)))[0]:
                    receiving.cancel()
                    raise Refused(408, late if wait < self.timeout else stalled)
                message = receiving.result()
                if message["type"] == "http.disconnect":
                    raise Refused(400, "the upload ended before its last byte")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.drain_bytes:
                    raise Refused(413, too_large)
                if size > self.max_bytes:  # read on to its end, held no longer
                    self.buffered -= len(body)
                    body = bytearray()
                elif self.buffered + len(chunk) > self.budget:
                    raise Refused(503, "the server holds too many uploads at once: retry shortly")
                else:
                    body += chunk
                    self.buffered += len(chunk)
                if not message.get("more_body", False):
                    if size > self.max_bytes:
                        raise Refused(413, too_large)
                    return body
        except Refused:
            self.buffered -= len(body)
            raise

    async def _decode(self, body: bytearray, form_type: str | None) -> Tensor:
        """The pixels of the upload: the body, or the file of a form of Content-Type `form_type`."""
        if self.decoding is None:
            self.decoding = asyncio.Semaphore(DECODERS)
        async with self.decoding:  # in threads: the server keeps answering meanwhile
            return await asyncio.to_thread(self._pixels, body, form_type)

    def _pixels(self, body: bytearray, form_type: str | None) -> Tensor:
        data, name = _form_file(form_type, body) if form_type else (body, "the request body")
        try:
            width, height, _ = image_header(data, name)
        except DataError as err:  # a ValueError too: caught first, as it says it all
            raise Refused(422, str(err)) from None
        except UNREADABLE as err:  # as decode_image says it
            raise Refused(422, f"cannot read image {name}: {err}") from None
        if width * height > self.max_pixels:
            limit = f"--max_megapixels ({self.max_pixels / 1e6:g})"
            raise Refused(422, f"refusing image {name}: {width}x{height} is more than {limit}")
        try:  # as infer reads a file: exact decode, a large JPEG reduced no lower than the size
            return self.transform(decode_image(data, name, self.image_size))
        except DataError as err:
            raise Refused(422, str(err)) from None


_BODY_HEADERS = (b"content-type", b"content-length", b"transfer-encoding")


def _is_form(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    if media.startswith("image/") or media == "application/octet-stream":
        return False
    if media == "multipart/form-data":
        return True
    raise Refused(
        415,
        f"Content-Type {media or '(none)'} is not accepted: send the image as the body, with "
        "Content-Type image/jpeg, image/png, ... or application/octet-stream, or as the file "
        "of a multipart/form-data upload",
    )


def _form_file(content_type: str, body: bytearray) -> tuple[bytearray, str]:
    """The first file of a multipart/form-data body, and its file name.

    Found with `bytes.find`, part by part, up to `MAX_FORM_PARTS`: neither the email package's
    line-by-line parser nor a split into every part, which 20 MB of delimiters keep busy.
    """
    boundary = _parameter("content-type", content_type, "boundary")
    if not boundary:
        raise Refused(400, "the multipart/form-data Content-Type has no boundary")
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    # the first delimiter; -2 where it opens the body, without the CRLF before it
    at = -2 if body.startswith(delimiter[2:]) else body.find(delimiter)
    for _ in range(MAX_FORM_PARTS if at != -1 else 0):
        start = at + len(delimiter)
        end = body.find(delimiter, start)  # the part's end: none after the last part
        if end < 0:
            break
        head_end = body.find(b"\r\n\r\n", start, min(end, start + MAX_FORM_HEAD))
        head = body[start:head_end].decode("latin-1") if head_end >= 0 else ""
        for line in head.split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-disposition":
                filename = _parameter(name, value, "filename")
                if filename is not None:  # shown in answers: no control characters
                    filename = "".join(c if c.isprintable() else "?" for c in filename[:200])
                    return body[head_end + 4 : end], filename or "the uploaded file"
        at = end
    raise Refused(400, "the form has no file: send the image as a file, as curl -F file=@x.jpg")


def _parameter(header: str, value: str, name: str) -> str | None:
    """A parameter of a header value (`boundary` of a Content-Type), quotes removed."""
    message = Message()
    message[header] = value
    found = message.get_param(name, header=header)
    return None if found is None else collapse_rfc2231_value(found)


async def _answer(send, status: int, sentence: str) -> None:
    body = json.dumps({"detail": sentence}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    headers.append((b"connection", b"close"))  # the client may still be sending, unread
    headers += [(b"retry-after", b"1")] if status == 503 else []  # uploads end soon
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ImageClassifierAPI(litserve.LitAPI if litserve else object):
    """The inference worker: `UploadGuard`'s pixels through the model, in batches, as answers."""

    def __init__(
        self, model: str, image_size: int, max_batch_size: int, batch_timeout: float
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=API_PATH
        )
        self.model_path = model
        self.image_size = image_size

    def setup(self, device: str) -> None:
        self.model = load_exported(self.model_path)
        self.device = "cpu"
        if device != "cpu" and isinstance(self.model.run, torch.nn.Module):
            self.model.run.to(device)  # an ONNX model stays on onnxruntime's CPU provider
            self.device = device

    # `request` and the response are not annotated: LitServe takes the annotations as the
    # endpoint's body and response types; without, the JSON body comes as a dict.
    def decode_request(self, request):
        pixels = bytearray(base64.b64decode(request["pixels"]))
        size = self.image_size
        return torch.frombuffer(pixels, dtype=torch.uint8).view(3, size, size)

    def predict(self, images: Tensor) -> Tensor:
        """Probabilities of LitServe's stack of images, or of one image without batching."""
        batch = images if images.dim() == 4 else images[None]
        self.batch_size = len(batch)  # LitServe encodes a batch's answers before the next batch
        probabilities = self.model.probabilities(batch.to(self.device)).cpu()
        return probabilities if images.dim() == 4 else probabilities[0]

    def encode_response(self, probabilities: Tensor):
        top = top_classes(probabilities, self.model.class_names)
        top_k = [{"label": label, "probability": p} for label, p in top]
        answer = {"label": top[0][0], "probability": top[0][1], "top_k": top_k}
        return {**answer, "batch_size": self.batch_size}


class _Server(litserve.LitServer if litserve else object):
    """LitServer whose inference worker ignores SIGTERM (`_IgnoreSigterm`): one sent to the
    whole process group (systemd, dumb-init) leaves it to answer the requests in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, callbacks=[_IgnoreSigterm()], **kwargs)

    def _perform_graceful_shutdown(self, *args, **kwargs) -> None:
        for worker in self.inference_workers:  # no request left for it: no SIGTERM, 5 s, kill
            worker.terminate = worker.kill
        super()._perform_graceful_shutdown(*args, **kwargs)


class _IgnoreSigterm(litserve.Callback if litserve else object):
    def on_before_setup(self, *args, **kwargs) -> None:  # in the inference worker
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


def _end_children() -> None:
    """Stop any process LitServe left, as after a SIGTERM before its servers had started."""
    for child in multiprocessing.active_children():
        child.kill()  # no request in flight; they ignore SIGTERM
        child.join(timeout=10)


def main(args: list[str] | None = None) -> int:
    options = _parser().parse_args(args)
    if litserve is None:
        raise DataError("serve needs LitServe: install the serve extra (pip install '.[serve]')")
    _check_port(options.host, options.port)
    # loaded here too, so that a bad file stops with one line before any process starts
    image_size = load_exported(options.model).image_size
    api = ImageClassifierAPI(
        str(options.model), image_size, options.max_batch_size, options.batch_timeout
    )
    guard = {
        "image_size": image_size,
        "max_bytes": int(options.max_upload_mb * 2**20),
        "max_pixels": int(options.max_megapixels * 1e6),
        "timeout": options.upload_timeout,
        "deadline": options.upload_deadline,
    }
    server = _Server(api, accelerator=options.accelerator, middlewares=[(UploadGuard, guard)])
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
    finally:
        _end_children()
    return 0


def _check_port(host: str, port: int) -> None:
    """One line for a port in use, rather than uvicorn's log line and exit code 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as err:
            raise DataError(f"--port {port}: cannot listen on {host}: {err.strerror}") from None


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
