"""`serve --model model.pt2`: POST an image, get `infer`'s top classes (docs/inference.md). The
upload is read and decoded by `read_upload`, a FastAPI dependency, in the HTTP process: a bad one
is answered 4xx there, not failing a batch (LitServe 0.2.19 fails all if decode_request raises)."""

import asyncio
import functools
import multiprocessing
import os
import signal
import socket
from email.parser import BytesParser
from email.policy import HTTP
from typing import Annotated, Literal

import numpy as np
import torch
from jsonargparse import ArgumentParser
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt, restricted_number_type
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

DECODERS = 4  # decodes at a time in an HTTP process, each at most --max_megapixels
DRAIN = 16  # a body up to this many times --max_upload_mb is read to its end before the 413
MAX_FORM_PARTS = 64  # a form's parts looked at for its file


def _refuse(status: int, sentence: str) -> "HTTPException":
    return HTTPException(status, sentence, {"Connection": "close"})  # the rest may be unread


async def read_upload(request: "Request") -> np.ndarray:
    """The dependency of /predict: the upload's pixels as `infer` reads a file, or a 4xx with one
    sentence. `main` keeps its options and a semaphore of DECODERS in the app's state."""
    options = request.app.state.options
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    form = media == "multipart/form-data"
    if not (form or media.startswith("image/") or media == "application/octet-stream"):
        send = "send an image/... or application/octet-stream body or a multipart form"
        raise _refuse(415, f"Content-Type {media or '(none)'} is not accepted: {send}")
    try:  # uvicorn has no limit on a body's size or time
        async with asyncio.timeout(options.upload_timeout):
            body = await _body(request, int(options.max_upload_mb * 2**20))
    except TimeoutError:
        late = f"the upload took over {options.upload_timeout:g} s (--upload_timeout)"
        raise _refuse(408, late) from None
    except ClientDisconnect:
        raise _refuse(400, "the upload ended before its last byte") from None
    async with request.app.state.decoding:  # in threads: the server answers others meanwhile
        form_type = request.headers["content-type"] if form else None
        return await asyncio.to_thread(_pixels, body, form_type, options)


async def _body(request: "Request", max_bytes: int) -> bytearray:
    """The body; one too large read to its end (up to DRAIN times the limit) before the 413, as
    http.client sends it all before it reads; curl's 100-continue answered at once."""
    declared = int(request.headers.get("content-length") or 0)  # uvicorn checks it is one
    waits = request.headers.get("expect", "").lower() == "100-continue"
    body, size = bytearray(), 0
    if declared <= max_bytes * (1 if waits else DRAIN):
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes * DRAIN:
                break
            if size <= max_bytes:
                body += chunk
    if max(size, declared) > max_bytes:
        raise _refuse(413, f"the upload is larger than --max_upload_mb ({max_bytes / 2**20:g} MB)")
    return body


def _form_file(content_type: str, body: bytearray) -> tuple[bytes, str]:
    """A multipart form's first file and its name, by the standard library's MIME parser
    (FastAPI's needs python-multipart, which LitServe does not install)."""
    if body.count(b"\r\n--") > MAX_FORM_PARTS:  # the parser makes an object of each part
        raise _refuse(400, f"the form has more than {MAX_FORM_PARTS} parts")
    text = b"Content-Type: %s\r\n\r\n%s" % (content_type.encode("latin-1"), body)
    for part in BytesParser(policy=HTTP).parsebytes(text).iter_parts():  # none: no boundary
        if (name := part.get_filename()) is not None:  # shown in answers: printable only
            name = "".join(c if c.isprintable() else "?" for c in name[:200])
            return part.get_payload(decode=True), name or "the uploaded file"
    raise _refuse(400, "the form has no file: send the image as a file, as curl -F file=@x.jpg")


def _pixels(body: bytearray, form_type: str | None, options) -> np.ndarray:
    data, name = _form_file(form_type, body) if form_type else (body, "the request body")
    try:
        width, height, _ = image_header(data, name)
        if width * height > options.max_megapixels * 1e6:
            limit = f"--max_megapixels ({options.max_megapixels:g})"
            raise DataError(f"refusing image {name}: {width}x{height} is more than {limit}")
        # as infer reads a file: exact decode, a large JPEG reduced no lower than the size
        image = decode_image(data, name, options.image_size)
        return eval_transform(options.image_size)(image).numpy()
    except DataError as err:  # a ValueError too: caught first, as it says it all
        raise _refuse(422, str(err)) from None
    except UNREADABLE as err:  # as decode_image says it
        raise _refuse(422, f"cannot read image {name}: {err}") from None


class ImageClassifierAPI(litserve.LitAPI if litserve else object):
    """The inference worker: `read_upload`'s pixels through the model (`model_path`) in batches."""

    def setup(self, device: str) -> None:
        # in the (spawned) worker: a SIGTERM to the process group leaves it to answer the
        # requests in flight; LitServe stops it last
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.model = load_exported(self.model_path)
        self.device = "cpu"
        if device != "cpu" and isinstance(self.model.run, torch.nn.Module):
            self.model.run.to(device)  # an ONNX model stays on onnxruntime's CPU provider
            self.device = device

    # LitServe makes this annotation the endpoint's argument: FastAPI runs read_upload for it
    def decode_request(
        self, request: Annotated[np.ndarray, Depends(read_upload)] if litserve else np.ndarray
    ) -> Tensor:
        return torch.from_numpy(request)

    def predict(self, images: Tensor) -> Tensor:  # a stack of images, or one without batching
        batch = images if images.dim() == 4 else images[None]
        self.batch_size = len(batch)  # LitServe encodes a batch's answers before the next batch
        probabilities = self.model.probabilities(batch.to(self.device)).cpu()
        return probabilities if images.dim() == 4 else probabilities[0]

    def encode_response(self, probabilities: Tensor):  # an annotation: the response's type
        top = top_classes(probabilities, self.model.class_names)
        top_k = [{"label": label, "probability": p} for label, p in top]
        return {**top_k[0], "top_k": top_k, "batch_size": self.batch_size}


def _stop_on_sigterm(main_pid: int, signum: int, frame) -> None:
    """SIGTERM as Ctrl-C: LitServe stops its HTTP servers (uvicorn answers the requests in flight)
    before the inference worker. Forked children ignore it (uvicorn has its own handler)."""
    if os.getpid() == main_pid:
        signal.signal(signum, signal.SIG_IGN)  # one stop at a time
        raise KeyboardInterrupt


def main(args: list[str] | None = None) -> int:
    options = _parser().parse_args(args)
    if litserve is None:
        raise DataError("serve needs LitServe: install the serve extra (pip install '.[serve]')")
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    try:  # one line, rather than uvicorn's log and exit code 3
        socket.create_server((options.host, options.port), family=family).close()
    except OSError as err:
        where = f"--port {options.port}: cannot listen on {options.host}"
        raise DataError(f"{where}: {err.strerror}") from None
    options.image_size = load_exported(options.model).image_size  # a bad file: one line, here
    api = ImageClassifierAPI(
        max_batch_size=options.max_batch_size, batch_timeout=options.batch_timeout
    )
    api.model_path = options.model
    server = litserve.LitServer(api, accelerator=options.accelerator)
    server.app.state.options, server.app.state.decoding = options, asyncio.Semaphore(DECODERS)
    signal.signal(signal.SIGTERM, functools.partial(_stop_on_sigterm, os.getpid()))
    try:  # no client.py written where the server is started
        server.run(
            options.host, options.port, log_level=options.log_level, generate_client_file=False
        )
    except KeyboardInterrupt:  # before the servers started: no request to finish
        pass
    finally:  # what LitServe left, as after a SIGTERM before its servers had started
        for child in multiprocessing.active_children():
            child.kill()  # no request in flight; they ignore SIGTERM
            child.join(timeout=10)
    return 0


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }} serve",
        description="Serve a model written by export over HTTP: POST /predict an image.",
    )
    add, port = (
        parser.add_argument,
        restricted_number_type("Port", int, [(">=", 1024), ("<=", 65535)]),
    )
    add("--model", required=True, help="model.pt2 or model.onnx")
    add(
        "--host",
        type=Literal["127.0.0.1", "0.0.0.0", "::"],
        default="127.0.0.1",
        help="0.0.0.0: all interfaces",
    )
    add("--port", type=port, default=8000, help="1024-65535")
    add("--max_batch_size", type=PositiveInt, default=32, help="images per batch")
    add("--batch_timeout", type=NonNegativeFloat, default=0.01, help="seconds")
    add("--max_upload_mb", type=PositiveFloat, default=20.0, help="largest upload")
    add("--max_megapixels", type=PositiveFloat, default=50.0, help="largest image")
    add("--upload_timeout", type=PositiveFloat, default=60.0, help="seconds an upload may take")
    add("--accelerator", type=Literal["auto", "cpu", "cuda"], default="auto")
    add("--log_level", type=Literal["debug", "info", "warning", "error"], default="info")
    return parser
