"""serve: infer's answers over HTTP, batched, from .pt2 and .onnx; hostile uploads refused in one
sentence; SIGTERM, to the server or its whole process group, finishes the requests in flight and
leaves no process behind."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_error, write_corrupt, write_image
from PIL import Image
from test_fuzz import write_mutants
from test_images import bomb_png

from {{ cookiecutter.package_name }}.commands.infer import classify, load_exported, top_classes
from {{ cookiecutter.package_name }}.data.images import read_image
from {{ cookiecutter.package_name }}.data.transforms import eval_transform

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
MAX_UPLOAD = 2**20  # the test servers' --max_upload_mb 1


@pytest.fixture(scope="module")
def model_pt2(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from {{ cookiecutter.package_name }}.commands.export import export_checkpoint

    return export_checkpoint(trained_checkpoint, tmp_path_factory.mktemp("export") / "model.pt2")[0]


@pytest.fixture(scope="module")
def images(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The training images, a JPEG large enough to be decoded reduced, and a PNG."""
    folder = tmp_path_factory.mktemp("uploads")
    large = write_image(folder / "large.jpg", (220, 40, 40), size=(120, 90))
    small = write_image(folder / "small.png", (40, 220, 40), size=(20, 24))
    return [*sorted((trained_checkpoint.parent / "images").rglob("*.jpg")), large, small]


def infer_answers(model: Path, paths: list[Path]) -> dict[Path, list[tuple[str, float]] | None]:
    """What infer makes of each file: its top classes, or None when infer reports it unreadable."""
    exported = load_exported(model)
    answers = dict.fromkeys(paths)
    for path, probabilities in classify(exported, [str(p) for p in paths], 32, lambda _: None):
        answers[Path(path)] = top_classes(probabilities, exported.class_names)
    return answers


def assert_infers_answer(answer: dict, expected: list[tuple[str, float]]) -> None:
    top = [(item["label"], item["probability"]) for item in answer["top_k"]]
    assert [label for label, _ in top] == [label for label, _ in expected]
    assert (answer["label"], answer["probability"]) == top[0]
    for (_, p), (_, q) in zip(top, expected, strict=True):
        assert abs(p - q) < 1e-5  # float32, batched with other images or not


def through_upload(receive, content_type: str, upload=None, **headers: str) -> tuple[int, object]:
    """What `Upload` makes of one request in-process, its body from `receive`: 200 and the
    pixels, or the status and sentence of its refusal (its headers in `refused_headers`)."""
    import asyncio

    from fastapi import HTTPException
    from starlette.requests import Request

    from {{ cookiecutter.package_name }}.commands.serve import Upload

    upload = upload or Upload(16, MAX_UPLOAD, 10**6, timeout=9, deadline=9)
    headers = {"content-type": content_type, **headers}
    scope = {"type": "http", "method": "POST", "path": "/predict"}
    scope["headers"] = [(k.encode(), v.encode()) for k, v in headers.items()]
    try:
        return 200, asyncio.run(upload(Request(scope, receive)))
    except HTTPException as refused:
        refused_headers.append(refused.headers)
        return refused.status_code, refused.detail


refused_headers: list[dict] = []


def whole(body: bytes):
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


# --- talking to a server ---


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(port: int, body: bytes, content_type: str | None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request("POST", "/predict", body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def form(data: bytes, filename: str | None = "upload.jpg") -> tuple[bytes, str]:
    """A multipart/form-data body with one field (a file, if `filename`), as `curl -F` sends."""
    boundary = "----test" + "7" * 20
    disposition = 'form-data; name="file"' + (f'; filename="{filename}"' if filename else "")
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
    head += "Content-Type: application/octet-stream\r\n\r\n"
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def raw_post(port: int, head: dict[str, str], chunks: list[bytes], pause: float = 0) -> tuple:
    """POST over a bare socket: the headers, then each chunk (`pause` seconds after the first),
    stopping as soon as the server answers, as curl does; returns (status, JSON body)."""
    lines = ["POST /predict HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in head.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        for number, chunk in enumerate(chunks):
            if select.select([sock], [], [], 0)[0]:
                break  # answered early: send no more
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            if number == 0:
                time.sleep(pause)
        with sock.makefile("rb") as response:
            status = int(response.readline().split()[1])
            length = 0
            while (line := response.readline().strip()) != b"":
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            return status, json.loads(response.read(length))


def split(data: bytes, size: int = 65536) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def chunked(data: bytes) -> list[bytes]:
    """`data` in HTTP/1.1 chunks: a body sent with no Content-Length."""
    return [b"%x\r\n%s\r\n" % (len(part), part) for part in split(data)] + [b"0\r\n\r\n"]


def form_head(data: bytes) -> dict[str, str]:
    body, content_type = form(data)
    return {"Content-Type": content_type, "Content-Length": str(len(body))}


def start_server(model: Path, *options: str, cwd: Path) -> tuple[subprocess.Popen, int]:
    """`serve` in its own process group, once /health answers; its output in `cwd`/serve.log."""
    port = free_port()
    command = [sys.executable, "-m", PACKAGE, "serve", "--model", str(model), "--port", str(port)]
    return launch([*command, "--log_level", "warning", *options], port, cwd), port


def launch(command: list[str], port: int, cwd: Path) -> subprocess.Popen:
    with open(cwd / "serve.log", "wb") as log:
        process = subprocess.Popen(
            command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"serve exited with {process.returncode}: {server_log(cwd)}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.5)
    kill_group(process)
    pytest.fail(f"serve did not answer /health in 240 s: {server_log(cwd)}")


def server_log(cwd: Path) -> str:
    return (cwd / "serve.log").read_text(errors="replace")[-3000:]


def kill_group(process: subprocess.Popen) -> None:
    """Whatever the outcome: the server and every process it started (its own group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def descendants(pid: int) -> set[int]:
    """The processes below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def server(model_pt2: Path, tmp_path_factory: pytest.TempPathFactory):
    """One server for the module: batches of up to 8 within 50 ms, uploads up to 1 MB and 4
    megapixels, stalls of 3 s."""
    cwd = tmp_path_factory.mktemp("server")
    options = ["--max_batch_size", "8", "--batch_timeout", "0.05", "--max_upload_mb", "1"]
    options += ["--max_megapixels", "4", "--upload_timeout", "3"]
    process, port = start_server(model_pt2, *options, cwd=cwd)
    try:
        yield port
    finally:
        kill_group(process)


# --- in-process: no server ---


def test_without_litserve_serve_says_how_to_install_it(tmp_path: Path) -> None:
    blocker = tmp_path / "blocked" / "litserve"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named litserve')\n")
    path = [str(blocker.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "serve", "--model", "model.pt2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "pip install '.[serve]'" in one_error(done.returncode, done.stderr)


def test_a_bad_model_is_one_error_line(tmp_path: Path, capsys) -> None:
    pytest.importorskip("litserve")
    from {{ cookiecutter.package_name }}.__main__ import main

    checkpoint = tmp_path / "model.pt2"
    torch.save({"state_dict": {}}, checkpoint)
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--model", str(checkpoint)])
    error = one_error(exit_info.value.code, capsys.readouterr().err)
    assert "is a checkpoint, not an exported model" in error


def test_the_upload_reader_and_the_worker_give_infers_answer(
    model_pt2: Path, images: list[Path]
) -> None:
    """The two halves of the server in-process: the pixels read from an upload are infer's, and
    so are the worker's answers for them, in one batch and one at a time."""
    from {{ cookiecutter.package_name }}.commands.serve import ImageClassifierAPI

    pixels = []
    for number, path in enumerate(images):
        data = path.read_bytes()
        body, content_type = form(data) if number % 2 else (data, "image/jpeg")
        status, read = through_upload(whole(body), content_type)
        assert status == 200, read
        pixels.append(read)
    api = ImageClassifierAPI(str(model_pt2), max_batch_size=8, batch_timeout=0)
    api.pre_setup()  # as LitServer does: the default batch and unbatch
    api.setup("cpu")
    pixels = [api.decode_request(read) for read in pixels]
    for path, image in zip(images, pixels, strict=True):
        assert torch.equal(image, eval_transform(16)(read_image(str(path), 16)))
    expected = infer_answers(model_pt2, images)
    batched = [api.encode_response(p) for p in api.unbatch(api.predict(api.batch(pixels)))]
    for path, image, answer in zip(images, pixels, batched, strict=True):
        assert_infers_answer(answer, expected[path])
        assert answer["batch_size"] == len(images)
        alone = api.encode_response(api.predict(image))
        assert_infers_answer(alone, expected[path])
        assert alone["batch_size"] == 1


def test_stalled_and_slow_uploads_time_out_and_uploads_held_at_once_are_bounded() -> None:
    """Uploads that stall hold their bytes until --upload_timeout; beyond the budget of bytes
    held at once, the next upload is answered 503 at once; every byte is given back. An upload
    of a byte every 0.05 s never stalls, but is cut at --upload_deadline."""
    import asyncio

    from fastapi import HTTPException
    from starlette.requests import Request

    from {{ cookiecutter.package_name }}.commands.serve import Upload

    upload = Upload(16, 1000, 10**6, timeout=0.5, deadline=9)
    upload.budget = 2500  # two stalled uploads of 900 bytes fit, a third does not

    async def stalled_upload() -> tuple[int, str | None]:
        messages = [{"type": "http.request", "body": bytes(900), "more_body": True}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)  # the client sends nothing more

        scope = {"type": "http", "method": "POST", "path": "/predict"}
        scope["headers"] = [(b"content-type", b"image/jpeg"), (b"content-length", b"1000")]
        try:
            await upload(Request(scope, receive))
        except HTTPException as refused:
            return refused.status_code, refused.headers.get("Retry-After")
        pytest.fail("a stalled upload was read")

    async def three() -> list:
        return await asyncio.gather(*(stalled_upload() for _ in range(3)))

    answered = sorted(asyncio.run(three()))
    assert answered == [(408, None), (408, None), (503, "1")]  # 503: retry in a second
    assert upload.buffered == 0

    sent = []

    async def receive() -> dict:  # 100 bytes in 5 s
        await asyncio.sleep(0.05)
        sent.append(b"x")
        return {"type": "http.request", "body": b"x", "more_body": len(sent) < 100}

    slow = Upload(16, 1000, 10**6, timeout=0.5, deadline=1)
    started = time.monotonic()
    status, detail = through_upload(receive, "image/jpeg", slow)
    assert status == 408 and 1 <= time.monotonic() - started < 5
    assert detail == "the upload took over 1 s (--upload_deadline)"
    assert slow.buffered == 0


def test_a_refusal_is_one_sentence_and_a_form_is_searched_for_its_file(images: list[Path]) -> None:
    """Each refusal says what is wrong once and closes the connection; a form's file is found
    among its first fields, in the decoding thread rather than the server's event loop."""
    import threading

    from {{ cookiecutter.package_name }}.commands import serve

    unknown = "not a known image format"
    answer = through_upload(whole(b"not an image"), "image/jpeg")
    assert answer == (422, f"cannot read image the request body: {unknown}")
    assert refused_headers[-1] == {"Connection": "close"}
    assert through_upload(whole(form(b"not an image", "notes.jpg")[0]), form(b"")[1]) == (
        422,
        f"cannot read image notes.jpg: {unknown}",
    )
    status, detail = through_upload(whole(b"--x\r\n"), "multipart/form-data")
    assert (status, detail) == (400, "the multipart/form-data Content-Type has no boundary")
    data = images[0].read_bytes()
    status, expected = through_upload(whole(data), "image/jpeg")
    assert status == 200
    body, content_type = form(data)
    boundary = content_type.split("boundary=")[1].encode()
    field = b'--%s\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n' % boundary
    threads = []
    parse = serve._form_file

    def recorded(*args):
        threads.append(threading.current_thread())
        return parse(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve, "_form_file", recorded)
        # after a preamble; after a field; after more fields than are looked at: refused
        for before in (b"preamble\r\n", field):
            status, read = through_upload(whole(before + body), content_type)
            assert status == 200 and np.array_equal(read, expected)
        fields = field * (serve.MAX_FORM_PARTS + 1)
        status, detail = through_upload(whole(fields + body), content_type)
        assert (status, detail) == (400, f"the form has more than {serve.MAX_FORM_PARTS} parts")
    assert len(threads) == 3 and threading.main_thread() not in threads


def test_a_port_in_use_is_one_error_line(tmp_path: Path, capsys) -> None:
    pytest.importorskip("litserve")
    from {{ cookiecutter.package_name }}.__main__ import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "--model", str(tmp_path / "model.pt2"), "--port", port])
    error = one_error(exit_info.value.code, capsys.readouterr().err)
    assert f"--port {port}: cannot listen on 127.0.0.1" in error


# --- one server ---


def ask_at_once(port: int, model: Path, images: list[Path]) -> list[dict]:
    """Every image from 8 clients at once, as raw bodies and forms in turn; each answer must be
    infer's. Returns the answers."""

    def ask(number: int) -> tuple[int, dict]:
        data = images[number].read_bytes()
        return post(port, *(form(data) if number % 2 else (data, "image/jpeg")))

    with ThreadPoolExecutor(8) as pool:  # at once, so that the server batches them
        answers = list(pool.map(ask, range(len(images))))
    expected = infer_answers(model, images)
    for path, (status, answer) in zip(images, answers, strict=True):
        assert status == 200, answer
        assert_infers_answer(answer, expected[path])
    return [answer for _, answer in answers]


@pytest.mark.slow
def test_answers_are_infers_batched_as_raw_bodies_and_forms(
    server: int, model_pt2: Path, images: list[Path]
) -> None:
    answers = ask_at_once(server, model_pt2, images)
    assert max(answer["batch_size"] for answer in answers) > 1  # the model saw a batch


@pytest.mark.slow
def test_an_onnx_model_is_served_with_infers_answers(
    trained_checkpoint: Path, images: list[Path], tmp_path: Path
) -> None:
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)
    from {{ cookiecutter.package_name }}.commands.export import export_checkpoint

    model = export_checkpoint(trained_checkpoint, tmp_path / "model.onnx", "onnx")[0]
    process, port = start_server(model, "--batch_timeout", "0.05", cwd=tmp_path)
    try:
        answers = ask_at_once(port, model, images)
    finally:
        kill_group(process)
    assert max(answer["batch_size"] for answer in answers) > 1


@pytest.mark.slow
def test_hostile_uploads_are_refused_while_good_ones_are_answered(
    server: int, model_pt2: Path, images: list[Path], tmp_path: Path
) -> None:
    """Damaged files of every format, a bomb, text, the wrong type, forms without a file and
    uploads over the limit, sent at once among good images: each gets infer's answer or a 4xx
    with a sentence; the server answers on."""
    mutants = write_mutants(tmp_path / "mutants", per_kind=1)
    bomb = tmp_path / "bomb.png"
    Image.new("L", (1, 1)).save(bomb)
    bomb_png(bomb, 100_000, 100_000)
    text = tmp_path / "notes.jpg"
    text.write_text("not an image\n" * 50)
    files = [*images, *mutants, bomb, text, write_corrupt(tmp_path / "cut.jpg")]
    expected = infer_answers(model_pt2, files)
    over = b"\xff\xd8" + bytes(MAX_UPLOAD)
    jpeg = images[0].read_bytes()
    large = tmp_path / "large.png"  # 5 megapixels, a few kB: over the server's 4
    Image.new("RGB", (2500, 2000), (90, 90, 90)).save(large)
    stalled = {"Content-Type": "image/jpeg", "Content-Length": "5000"}
    over_head = {"Content-Type": "image/jpeg", "Content-Length": str(len(over))}
    over_head["Expect"] = "100-continue"  # as curl asks before a large body: it waits
    jobs: list[tuple] = [("file", path) for path in files]
    jobs += [
        ("refused", 415, lambda: post(server, jpeg, "text/plain")),
        ("refused", 415, lambda: post(server, b'{"pixels": "AAAA"}', "application/json")),
        ("refused", 415, lambda: post(server, jpeg, None)),
        ("refused", 400, lambda: post(server, *form(jpeg, filename=None))),
        ("refused", 422, lambda: post(server, b"", "image/png")),
        ("refused", 413, lambda: raw_post(server, over_head, [])),  # headers only, then waits
        # sent whole before the answer is read, as Python's http.client and urllib do
        ("refused", 413, lambda: post(server, over, "image/jpeg")),
        ("refused", 413, lambda: post(server, *form(over))),
        ("refused", 408, lambda: raw_post(server, stalled, [jpeg[:100]])),  # then nothing
        ("refused", 422, lambda: post(server, large.read_bytes(), "image/png")),
        ("refused", 422, lambda: post(server, *form(b"text", filename="a\nb\x00.jpg"))),
        ("refused", 413, lambda: raw_post(server, form_head(over), split(form(over)[0]))),
        (
            "refused",
            413,
            lambda: raw_post(
                server,
                {"Transfer-Encoding": "chunked", "Content-Type": "image/jpeg"},
                chunked(over),
            ),
        ),
    ]
    random.Random(0).shuffle(jobs)

    def run(job: tuple) -> tuple[int, dict]:
        if job[0] == "file":
            data = job[1].read_bytes()
            return post(server, *(form(data) if len(data) % 2 else (data, "image/jpeg")))
        return job[2]()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    refused = 0
    for job, (status, answer) in zip(jobs, results, strict=True):
        if job[0] == "refused":
            assert status == job[1], (job, answer)
        elif expected[job[1]] is None:  # infer could not read it either
            assert status == 422, (job, answer)
            assert re.match(
                r"(cannot read|refusing) image (the request body|upload)", answer["detail"]
            )
        else:
            assert status == 200, (job, answer)
            assert_infers_answer(answer, expected[job[1]])
            continue
        refused += 1
        assert answer["detail"].isprintable() and "Traceback" not in str(answer)
        assert len(re.findall("image", answer["detail"].split(":")[0])) <= 1, answer  # said once
    assert refused > 40  # most mutants, the bomb, the text and the other refusals
    status, answer = post(server, large.read_bytes(), "image/png")
    assert answer["detail"].endswith("2500x2000 is more than --max_megapixels (4)")
    status, answer = post(server, images[-1].read_bytes(), "image/png")
    assert status == 200 and answer["label"] == expected[images[-1]][0][0]


# --- SIGTERM ---


def answers_across_sigterm(
    process: subprocess.Popen, port: int, data: bytes, *, group: bool, sent_whole: int = 0
) -> list[tuple[int, dict]]:
    """Four uploads of `data` half sent and `sent_whole` more sent whole when SIGTERM comes, to
    the server (as Docker and Kubernetes send it) or its whole process group (as systemd,
    dumb-init and `kill -TERM -PGID` do); their answers."""
    head = {"Content-Type": "image/jpeg", "Content-Length": str(len(data))}
    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(post, port, data, "image/jpeg") for _ in range(sent_whole)]
        # the headers and 100 bytes now, the rest 2 s later, after SIGTERM
        jobs += [pool.submit(raw_post, port, head, [data[:100], data[100:]], 2) for _ in range(4)]
        time.sleep(1)
        (os.killpg if group else os.kill)(process.pid, signal.SIGTERM)
        return [job.result(timeout=120) for job in jobs]


def assert_sigterm_answers_them(
    process: subprocess.Popen, port: int, data: bytes, expected: dict, cwd: Path, **sigterm
) -> None:
    """`answers_across_sigterm`: every upload is answered `expected`, as `infer` answers; then
    the server exits 0 and leaves none of its processes running."""
    started = descendants(process.pid)
    assert len(started) >= 3  # LitServe's manager, inference worker and HTTP server
    answers = answers_across_sigterm(process, port, data, **sigterm)
    uploads = 4 + sigterm.get("sent_whole", 0)
    assert [status for status, _ in answers] == [200] * uploads, answers
    for _, answer in answers:
        assert_infers_answer(answer, expected)
    assert process.wait(timeout=120) == 0, server_log(cwd)
    time.sleep(1)
    assert [pid for pid in started if running(pid)] == [], server_log(cwd)


@pytest.mark.slow
def test_a_sigterm_to_the_process_group_finishes_the_requests_in_flight(
    model_pt2: Path, images: list[Path], tmp_path: Path
) -> None:
    """A good answer, a refusal, then SIGTERM to every process of the server at once, while
    uploads are arriving and a batch waits in the inference worker: each is answered."""
    options = ["--batch_timeout", "1.5", "--max_batch_size", "8"]  # uploads wait for a batch
    process, port = start_server(model_pt2, *options, cwd=tmp_path)
    try:
        data = images[0].read_bytes()
        expected = infer_answers(model_pt2, [images[0]])[images[0]]
        status, answer = post(port, data, "image/jpeg")
        assert status == 200 and answer["batch_size"] == 1, answer
        assert_infers_answer(answer, expected)
        status, answer = post(port, b"not an image", "image/png")
        assert status == 422 and answer["detail"].endswith("not a known image format"), answer
        assert_sigterm_answers_them(
            process, port, data, expected, tmp_path, group=True, sent_whole=4
        )
    finally:
        kill_group(process)


# --- the README's commands, then SIGTERM ---


def readme_serving() -> list[str]:
    """The commands of the README's serving block."""
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Serve the model\n.*?```bash\n(.*?)```", text, re.DOTALL).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_readme_serving_runs_and_sigterm_finishes_the_requests_in_flight(
    trained_checkpoint: Path, images: list[Path], tmp_path: Path
) -> None:
    export, serve, ask = readme_serving()
    assert export.startswith(f"python -m {PACKAGE} export ") and ask.startswith("curl ")
    docs = (PROJECT / "docs" / "inference.md").read_text(encoding="utf-8")
    assert all(line in docs for line in (export, serve, ask))  # the same commands there
    shutil.copy(images[0], tmp_path / "photo.jpg")
    argv = shlex.split(export)
    argv[argv.index("--ckpt_path") + 1] = str(trained_checkpoint)
    done = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]

    port = free_port()
    serve_argv = shlex.split(serve.replace("8000", str(port)))
    process = launch([sys.executable, *serve_argv[1:]], port, tmp_path)
    try:
        ask = shlex.split(ask.replace("8000", str(port)))
        if shutil.which("curl"):
            done = subprocess.run(ask, cwd=tmp_path, capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr
            answer = json.loads(done.stdout)
        else:  # what `curl -F file=@photo.jpg` sends
            assert ask[1:3] == ["-F", "file=@photo.jpg"], ask
            answer = post(port, *form((tmp_path / "photo.jpg").read_bytes(), "photo.jpg"))[1]
        expected = infer_answers(tmp_path / "model.pt2", [tmp_path / "photo.jpg"])
        assert_infers_answer(answer, expected[tmp_path / "photo.jpg"])

        # uploads half sent when SIGTERM comes are still answered, then every process ends
        expected = infer_answers(tmp_path / "model.pt2", [images[1]])[images[1]]
        data = images[1].read_bytes()
        assert_sigterm_answers_them(process, port, data, expected, tmp_path, group=False)
    finally:
        kill_group(process)


@pytest.mark.slow
def test_the_serving_benchmark_runs(model_pt2: Path, tmp_path: Path) -> None:
    """scripts/serve_bench.py with tiny numbers, so that it cannot rot."""
    script = PROJECT / "scripts" / "serve_bench.py"
    options = ["--requests", "6", "--clients", "1", "3", "--rounds", "2", "--time_limit", "400"]
    done = subprocess.run(
        [sys.executable, str(script), "--model", str(model_pt2), *options],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"^\| (on|off) \| ([13]) \| 6 \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", done.stdout, re.M
    )
    assert sorted(rows) == [("off", "1"), ("off", "3"), ("on", "1"), ("on", "3")], done.stdout
    speedup = r"[\d.]+x \([\d.]+-[\d.]+\)"  # over all rounds (the lowest-the highest)
    line = rf"on / off, requests/s, by clients \(rounds' range\): 1: {speedup}, 3: {speedup}"
    assert re.search(line, done.stdout), done.stdout
    assert list(tmp_path.iterdir()) == []  # it writes nothing
