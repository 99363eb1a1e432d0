"""serve: infer's answers over HTTP, batched, from .pt2 and .onnx; hostile uploads refused in one
sentence; SIGTERM, to the server or its whole process group, finishes the requests in flight and
leaves no process behind. Two servers: the README's (.pt2, shared by the module) and an ONNX one."""

from __future__ import annotations

import asyncio
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
from conftest import one_error, running, write_corrupt, write_image
from PIL import Image
from test_fuzz import write_mutants
from test_images import png_bomb

from {{ cookiecutter.package_name }}.commands.infer import classify, load_exported, top_classes

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = "{{ cookiecutter.package_name }}"
MAX_UPLOAD = 2**20  # the test servers' --max_upload_mb 1


@pytest.fixture(scope="module")
def model_pt2(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's export command (in this process), in a folder of its own."""
    from {{ cookiecutter.package_name }}.__main__ import main

    export = readme_serving()[0]
    assert export.startswith(f"python -m {PACKAGE} export ")
    argv = shlex.split(export)
    argv[argv.index("--ckpt_path") + 1] = str(trained_checkpoint)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("readme"))
        main(argv[3:])
        return Path.cwd() / "model.pt2"


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


async def upload_answer(upload, receive, headers: dict[str, str]) -> tuple[int, object, dict]:
    """What `Upload` makes of one request, its body from `receive`: (200, the pixels, {}), or
    its refusal's status, sentence and headers."""
    from fastapi import HTTPException
    from starlette.requests import Request

    scope = {"type": "http", "method": "POST", "path": "/predict"}
    scope["headers"] = [(k.encode(), v.encode()) for k, v in headers.items()]
    try:
        return 200, await upload(Request(scope, receive)), {}
    except HTTPException as refused:
        return refused.status_code, refused.detail, refused.headers or {}


def through_upload(body, content_type: str, upload=None) -> tuple[int, object, dict]:
    """`upload_answer` for `body` (bytes sent whole, or a `receive`), with the servers' limits
    unless `upload` is given."""
    from {{ cookiecutter.package_name }}.commands.serve import Upload

    async def whole() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    upload = upload or Upload(16, MAX_UPLOAD, 10**6, timeout=9, deadline=9)
    receive = body if callable(body) else whole
    return asyncio.run(upload_answer(upload, receive, {"content-type": content_type}))


# --- talking to a server ---


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(port: int, body: bytes, content_type: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": content_type} if content_type else {}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    with contextlib.closing(connection):
        connection.request("POST", "/predict", body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())


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


def launch(command: list[str], port: int, cwd: Path) -> subprocess.Popen:
    """`command` (a server) in its own process group, once /health answers; its output in
    `cwd`/serve.log."""
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


def test_a_bad_model_or_a_port_in_use_is_one_error_line(tmp_path: Path, run_main) -> None:
    pytest.importorskip("litserve")
    torch.save({"state_dict": {}}, tmp_path / "model.pt2")
    done = run_main("serve", "--model", "model.pt2", cwd=tmp_path)
    assert "is a checkpoint, not an exported model" in one_error(done.returncode, done.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = run_main("serve", "--model", "model.pt2", "--port", port, cwd=tmp_path)
    error = one_error(done.returncode, done.stderr)
    assert f"--port {port}: cannot listen on 127.0.0.1" in error


def test_stalled_and_slow_uploads_time_out_and_uploads_held_at_once_are_bounded() -> None:
    """Uploads that stall hold their bytes until --upload_timeout; beyond the budget of bytes
    held at once, the next upload is answered 503 at once; every byte is given back. An upload
    of a byte every 0.05 s never stalls, but is cut at --upload_deadline."""
    from {{ cookiecutter.package_name }}.commands.serve import Upload

    upload = Upload(16, 1000, 10**6, timeout=0.5, deadline=9)
    upload.budget = 2500  # two stalled uploads of 900 bytes fit, a third does not

    async def stalled() -> tuple[int, str | None]:
        messages = [{"type": "http.request", "body": bytes(900), "more_body": True}]

        async def receive() -> dict:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)  # the client sends nothing more

        headers = {"content-type": "image/jpeg", "content-length": "1000"}
        status, _, said = await upload_answer(upload, receive, headers)
        return status, said.get("Retry-After")

    async def three() -> list:
        return await asyncio.gather(*(stalled() for _ in range(3)))

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
    status, detail, _ = through_upload(receive, "image/jpeg", slow)
    assert status == 408 and 1 <= time.monotonic() - started < 5
    assert detail == "the upload took over 1 s (--upload_deadline)" and slow.buffered == 0


def test_a_refusal_is_one_sentence_and_a_form_is_searched_for_its_file(images: list[Path]) -> None:
    """Each refusal says what is wrong once and closes the connection; a form's file is found
    among its first fields, in the decoding thread rather than the server's event loop."""
    import threading

    from {{ cookiecutter.package_name }}.commands import serve

    unknown = "not a known image format"
    answer = through_upload(b"not an image", "image/jpeg")
    assert answer == (
        422,
        f"cannot read image the request body: {unknown}",
        {"Connection": "close"},
    )
    answer = through_upload(form(b"not an image", "notes.jpg")[0], form(b"")[1])
    assert answer[:2] == (422, f"cannot read image notes.jpg: {unknown}")
    answer = through_upload(b"--x\r\n", "multipart/form-data")
    assert answer[:2] == (400, "the multipart/form-data Content-Type has no boundary")
    data = images[0].read_bytes()
    status, expected, _ = through_upload(data, "image/jpeg")
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
            status, read, _ = through_upload(before + body, content_type)
            assert status == 200 and np.array_equal(read, expected)
        fields = field * (serve.MAX_FORM_PARTS + 1)
        status, detail, _ = through_upload(fields + body, content_type)
        assert (status, detail) == (400, f"the form has more than {serve.MAX_FORM_PARTS} parts")
    assert len(threads) == 3 and threading.main_thread() not in threads


# --- the README's server, with the tests' limits ---


def readme_serving() -> list[str]:
    """The commands of the README's serving block, also in docs/inference.md."""
    text = (PROJECT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Serve the model\n.*?```bash\n(.*?)```", text, re.DOTALL).group(1)
    commands = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    docs = (PROJECT / "docs" / "inference.md").read_text(encoding="utf-8")
    assert all(line in docs for line in commands)  # the same commands there
    return commands


@pytest.fixture(scope="module")
def server(model_pt2: Path):
    """The README's serve command, with batches of up to 8 within 50 ms, uploads up to 1 MB and 4
    megapixels, stalls of 3 s. Yields (process, port, folder); the last test stops it."""
    port, cwd = free_port(), model_pt2.parent
    command = [sys.executable, *shlex.split(readme_serving()[1].replace("8000", str(port)))[1:]]
    options = ["--max_batch_size", "8", "--batch_timeout", "0.05", "--max_upload_mb", "1"]
    options += ["--max_megapixels", "4", "--upload_timeout", "3", "--log_level", "warning"]
    process = launch([*command, *options], port, cwd)
    try:
        yield process, port, cwd
    finally:
        kill_group(process)


@pytest.mark.slow
def test_the_readmes_curl_gets_infers_answer(server, images: list[Path]) -> None:
    _, port, cwd = server
    ask = shlex.split(readme_serving()[2].replace("8000", str(port)))
    assert ask[0] == "curl"
    shutil.copy(images[0], cwd / "photo.jpg")
    if shutil.which("curl"):
        done = subprocess.run(ask, cwd=cwd, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
    else:  # what `curl -F file=@photo.jpg` sends
        assert ask[1:3] == ["-F", "file=@photo.jpg"], ask
        answer = post(port, *form((cwd / "photo.jpg").read_bytes(), "photo.jpg"))[1]
    expected = infer_answers(cwd / "model.pt2", [cwd / "photo.jpg"])
    assert_infers_answer(answer, expected[cwd / "photo.jpg"])


@pytest.mark.slow
def test_hostile_uploads_are_refused_while_good_ones_are_answered(
    server, images: list[Path], tmp_path: Path
) -> None:
    """Damaged files of every format, a bomb, text, the wrong type, forms without a file and
    uploads over the limit, sent at once among good images (as raw bodies and forms, batched):
    each gets infer's answer or a 4xx with a sentence; the server answers on."""
    mutants = write_mutants(tmp_path / "mutants", per_kind=1)
    bomb = tmp_path / "bomb.png"
    png_bomb(bomb)
    text = tmp_path / "notes.jpg"
    text.write_text("not an image\n" * 50)
    files = [*images, *mutants, bomb, text, write_corrupt(tmp_path / "cut.jpg")]
    _, port, cwd = server
    expected = infer_answers(cwd / "model.pt2", files)
    over, jpeg = b"\xff\xd8" + bytes(MAX_UPLOAD), images[0].read_bytes()
    large = tmp_path / "large.png"  # 5 megapixels, a few kB: over the server's 4
    Image.new("RGB", (2500, 2000), (90, 90, 90)).save(large)
    stalled = {"Content-Type": "image/jpeg", "Content-Length": "5000"}
    chunks = {"Transfer-Encoding": "chunked", "Content-Type": "image/jpeg"}
    # as curl asks before a large body: it waits for the answer
    waits = {
        "Content-Type": "image/jpeg",
        "Content-Length": str(len(over)),
        "Expect": "100-continue",
    }
    jobs: list[tuple] = [(None, path) for path in files]
    jobs += [
        (415, lambda: post(port, jpeg, "text/plain")),
        (415, lambda: post(port, b'{"pixels": "AAAA"}', "application/json")),
        (415, lambda: post(port, jpeg, None)),
        (400, lambda: post(port, *form(jpeg, filename=None))),
        (422, lambda: post(port, b"", "image/png")),
        (413, lambda: raw_post(port, waits, [])),  # headers only, then waits
        # sent whole before the answer is read, as Python's http.client and urllib do
        (413, lambda: post(port, over, "image/jpeg")),
        (413, lambda: post(port, *form(over))),
        (408, lambda: raw_post(port, stalled, [jpeg[:100]])),  # then nothing
        (422, lambda: post(port, large.read_bytes(), "image/png")),
        (422, lambda: post(port, *form(b"text", filename="a\nb\x00.jpg"))),
        (413, lambda: raw_post(port, form_head(over), split(form(over)[0]))),
        (413, lambda: raw_post(port, chunks, chunked(over))),
    ]
    random.Random(0).shuffle(jobs)

    def run(job: tuple) -> tuple[int, dict]:
        if job[0] is None:
            data = job[1].read_bytes()
            return post(port, *(form(data) if len(data) % 2 else (data, "image/jpeg")))
        return job[1]()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    refused, batches = 0, []
    for (status_wanted, file), (status, answer) in zip(jobs, results, strict=True):
        if status_wanted is None and expected[file] is not None:
            assert status == 200, (file, answer)
            assert_infers_answer(answer, expected[file])
            batches.append(answer["batch_size"])
            continue
        if status_wanted is None:  # infer could not read it either
            assert status == 422, (file, answer)
            detail = r"(cannot read|refusing) image (the request body|upload)"
            assert re.match(detail, answer["detail"])
        assert status == (status_wanted or 422), (file, answer)
        refused += 1
        assert answer["detail"].isprintable() and "Traceback" not in str(answer)
        assert len(re.findall("image", answer["detail"].split(":")[0])) <= 1, answer  # said once
    assert refused > 40 and max(batches) > 1  # most mutants, the bomb, the text and the others
    status, answer = post(port, large.read_bytes(), "image/png")
    assert answer["detail"].endswith("2500x2000 is more than --max_megapixels (4)")
    status, answer = post(port, images[-1].read_bytes(), "image/png")
    assert status == 200 and answer["label"] == expected[images[-1]][0][0]


# --- SIGTERM ---


def assert_sigterm_finishes_the_requests_in_flight(
    process: subprocess.Popen, port: int, data: bytes, expected: list, cwd: Path, *, group: bool
) -> None:
    """Four uploads of `data` half sent (and, with `group`, four sent whole) when SIGTERM comes,
    to the server (as Docker and Kubernetes send it) or its whole process group (as systemd,
    dumb-init and `kill -TERM -PGID` do): each is answered `expected`, as `infer` answers; then
    the server exits 0 and leaves none of its processes running."""
    started = descendants(process.pid)
    assert len(started) >= 3  # LitServe's manager, inference worker and HTTP server
    head = {"Content-Type": "image/jpeg", "Content-Length": str(len(data))}
    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(post, port, data, "image/jpeg") for _ in range(4 * group)]
        # the headers and 100 bytes now, the rest 2 s later, after SIGTERM
        jobs += [pool.submit(raw_post, port, head, [data[:100], data[100:]], 2) for _ in range(4)]
        time.sleep(1)
        (os.killpg if group else os.kill)(process.pid, signal.SIGTERM)
        answers = [job.result(timeout=120) for job in jobs]
    assert [status for status, _ in answers] == [200] * len(jobs), answers
    for _, answer in answers:
        assert_infers_answer(answer, expected)
    assert process.wait(timeout=120) == 0, server_log(cwd)
    time.sleep(1)
    assert [pid for pid in started if running(pid)] == [], server_log(cwd)


@pytest.mark.slow
def test_an_onnx_model_is_served_and_a_sigterm_to_its_group_finishes_the_requests_in_flight(
    trained_checkpoint: Path, images: list[Path], tmp_path: Path
) -> None:
    """infer's answers, alone and batched; a refusal; then SIGTERM to every process of the server
    at once, while uploads are arriving and a batch waits in the inference worker: each is
    answered."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)
    from {{ cookiecutter.package_name }}.commands.export import export_checkpoint

    model = export_checkpoint(trained_checkpoint, tmp_path / "model.onnx", "onnx")[0]
    port = free_port()
    command = [sys.executable, "-m", PACKAGE, "serve", "--model", str(model), "--port", str(port)]
    options = ["--batch_timeout", "1.5", "--max_batch_size", "8"]  # uploads wait for a batch
    process = launch([*command, "--log_level", "warning", *options], port, tmp_path)
    try:
        everyone = infer_answers(model, images)
        data, expected = images[0].read_bytes(), everyone[images[0]]
        status, answer = post(port, data, "image/jpeg")
        assert status == 200 and answer["batch_size"] == 1, answer
        assert_infers_answer(answer, expected)
        status, answer = post(port, b"not an image", "image/png")
        assert status == 422 and answer["detail"].endswith("not a known image format"), answer
        with ThreadPoolExecutor(8) as pool:  # at once, raw bodies and forms: batched
            bodies = [
                form(p.read_bytes()) if n % 2 else (p.read_bytes(), "image/jpeg")
                for n, p in enumerate(images)
            ]
            answers = list(pool.map(lambda body: post(port, *body), bodies))
        assert max(answer["batch_size"] for _, answer in answers) > 1
        for path, (status, answer) in zip(images, answers, strict=True):
            assert status == 200, answer
            assert_infers_answer(answer, everyone[path])
        assert_sigterm_finishes_the_requests_in_flight(
            process, port, data, expected, tmp_path, group=True
        )
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


@pytest.mark.slow
def test_a_sigterm_to_the_readmes_server_finishes_the_requests_in_flight(
    server, images: list[Path]
) -> None:
    """Uploads half sent when SIGTERM comes are still answered, then every process ends. Last
    here: it stops the module's server."""
    process, port, cwd = server
    expected = infer_answers(cwd / "model.pt2", [images[1]])[images[1]]
    data = images[1].read_bytes()
    assert_sigterm_finishes_the_requests_in_flight(process, port, data, expected, cwd, group=False)
