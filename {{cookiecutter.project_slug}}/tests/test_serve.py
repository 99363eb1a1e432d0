"""serve: infer's answers over HTTP, batched, from .pt2 and .onnx; hostile uploads refused with a
sentence; SIGTERM, to the server or its whole process group, answers the requests in flight and
leaves no process behind. Two servers: the README's (.pt2, shared by the module) and an ONNX one."""

import argparse
import asyncio
import contextlib
import http.client
import importlib
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import one_error, running_in_group, write_corrupt, write_image
from PIL import Image
from test_fuzz import write_mutants
from test_images import png_bomb

from {{ cookiecutter.package_name }}.commands import serve
from {{ cookiecutter.package_name }}.commands.infer import classify, load_exported, top_classes

PROJECT = Path(__file__).resolve().parents[1]
MAX_UPLOAD = 2**20  # the test servers' --max_upload_mb 1
B = "----test" + "7" * 20  # a form's boundary
BOUNDARY = B.encode()


@pytest.fixture(scope="module")
def model_pt2(trained_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's export command (in this process), in a folder of its own."""
    from {{ cookiecutter.package_name }}.__main__ import main

    argv = shlex.split(readme_serving()[0])
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


def through_upload(body, content_type: str, **headers: str) -> tuple[int, object]:
    """`read_upload` in this process, with the test servers' limits but 1 megapixel and 0.5 s:
    (200, the pixels) or the refusal's (status, sentence). `body`: bytes, or an ASGI `receive`."""
    from fastapi import HTTPException
    from starlette.requests import Request

    async def whole() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def answer():
        limits = dict(max_upload_mb=1, max_megapixels=1, upload_timeout=0.5, image_size=16)
        state = SimpleNamespace(options=argparse.Namespace(**limits), decoding=asyncio.Semaphore())
        said = {"content-type": content_type} | {k.replace("_", "-"): v for k, v in headers.items()}
        said = [(k.encode(), v.encode()) for k, v in said.items()]
        scope = {"type": "http", "app": SimpleNamespace(state=state), "headers": said}
        return await serve.read_upload(Request(scope, body if callable(body) else whole))

    try:
        return 200, asyncio.run(answer())
    except HTTPException as refused:
        assert refused.headers == {"Connection": "close"}  # the rest of the body may be unread
        return refused.status_code, refused.detail


def form(data: bytes, filename: str | None = "upload.jpg") -> tuple[bytes, str]:
    """A multipart/form-data body with one field (a file, if `filename`), as `curl -F` sends."""
    name = 'name="file"' + (f'; filename="{filename}"' if filename else "")
    body = b"--%s\r\nContent-Disposition: form-data; %s\r\n\r\n%s\r\n--%s--\r\n"
    return body % (BOUNDARY, name.encode(), data, BOUNDARY), f"multipart/form-data; boundary={B}"


def test_uploads_are_refused_in_a_sentence_and_a_form_is_searched_for_its_file(tmp_path) -> None:
    unknown = "cannot read image the request body: not a known image format"
    assert through_upload(b"not an image", "image/jpeg") == (422, unknown)
    answer = through_upload(*form(b"not an image", "notes.jpg"))
    assert answer == (422, unknown.replace("the request body", "notes.jpg"))
    no_file = "the form has no file: send the image as a file, as curl -F file=@x.jpg"
    assert through_upload(form(b"x")[0], "multipart/form-data") == (400, no_file)  # no boundary
    assert through_upload(b"x", "text/plain")[0] == 415
    too_large = (413, "the upload is larger than --max_upload_mb (1 MB)")
    over, length = bytes(MAX_UPLOAD + 1), str(MAX_UPLOAD + 1)  # with no length, or with it
    assert through_upload(over, "image/jpeg") == too_large
    assert through_upload(over, "image/jpeg", content_length=length) == too_large

    async def unread() -> dict:  # curl's Expect: 100-continue: answered before a byte is read
        raise AssertionError("read")

    asks = dict(content_length=length, expect="100-continue")
    assert through_upload(unread, "image/jpeg", **asks) == too_large

    async def trickle() -> dict:  # a byte every 0.05 s: never a stall, but never done
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b"x", "more_body": True}

    started, late = time.monotonic(), (408, "the upload took over 0.5 s (--upload_timeout)")
    assert through_upload(trickle, "image/jpeg") == late and time.monotonic() - started < 3
    data = write_image(tmp_path / "a.jpg", (9, 9, 9)).read_bytes()
    status, expected = through_upload(data, "image/jpeg")
    assert status == 200 and expected.shape == (3, 16, 16)
    body, content_type = form(data)
    field = b'--%s\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n' % BOUNDARY
    threads, parse = [], serve._form_file

    def recorded(*args):
        threads.append(threading.current_thread())
        return parse(*args)

    with pytest.MonkeyPatch.context() as patch:  # parsed in a thread, not in the event loop
        patch.setattr(serve, "_form_file", recorded)
        for before in (b"preamble\r\n", field):  # after a preamble; after a field
            status, read = through_upload(before + body, content_type)
            assert status == 200 and np.array_equal(read, expected)
        fields = field * serve.MAX_FORM_PARTS  # more parts than are looked at
        many = (400, "the form has more than 64 parts")
        assert through_upload(fields + body, content_type) == many
    assert len(threads) == 3 and threading.main_thread() not in threads


def test_without_litserve_serve_says_how_to_install_it(run_main, tmp_path: Path) -> None:
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, "litserve", None)  # its import fails, as without the extra
            importlib.reload(serve)
            done = run_main("serve", "--model", "model.pt2", cwd=tmp_path)
    finally:
        importlib.reload(serve)
    assert "pip install '.[serve]'" in one_error(done.returncode, done.stderr)


def test_a_bad_model_or_a_port_in_use_is_one_error_line(tmp_path: Path, run_main) -> None:
    torch.save({"state_dict": {}}, tmp_path / "model.pt2")
    done = run_main("serve", "--model", "model.pt2", cwd=tmp_path)
    assert "not an exported model (not a .pt2 archive)" in one_error(done.returncode, done.stderr)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        done = run_main("serve", "--model", "model.pt2", "--port", port, cwd=tmp_path)
    assert f"--port {port}: cannot listen on 127.0.0.1" in one_error(done.returncode, done.stderr)


# --- servers ---


def post(port: int, body: bytes, content_type: str | None, chunks=(), pause=0, **head) -> tuple:
    """`body` sent whole before the answer is read (as http.client and urllib do), or each of
    `chunks` until the server answers (as curl does), the second `pause` s after the first;
    `head`: headers instead of `body`'s Content-Length. (status, JSON answer)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    head = {"Content-Type": content_type, **(head or {"Content-Length": len(body)})}
    with contextlib.closing(connection):
        connection.putrequest("POST", "/predict")
        for name, value in head.items():
            if value is not None:
                connection.putheader(name.replace("_", "-"), value)
        connection.endheaders()
        for number, chunk in enumerate(chunks or [body]):
            if select.select([connection.sock], [], [], 0)[0]:
                break  # answered early: send no more
            connection.send(chunk)
            time.sleep(pause if number == 0 else 0)
        response = connection.getresponse()
        return response.status, json.loads(response.read())


def launch(options: list[str], cwd: Path) -> tuple[subprocess.Popen, int]:
    """`serve` with `options` on a free port, in a process group of its own, once /health
    answers; its output in serve.log."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        options += ["--port", str(port := probe.getsockname()[1]), "--log_level", "warning"]
    with open(cwd / "serve.log", "wb") as log:
        command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "serve", *options]
        process = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=log, start_new_session=True)
    process.log = cwd / "serve.log"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process, port
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"serve did not answer /health: {server_log(process)}")


def server_log(process: subprocess.Popen) -> str:
    return process.log.read_text(errors="replace")[-3000:]


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
    """The README's serve command, with batches of up to 8 within 50 ms, uploads of up to 1 MB, 4
    megapixels and 5 s. Yields (process, port, folder); the last test stops it."""
    options = shlex.split(readme_serving()[1])[4:]
    assert options == ["--model", "model.pt2", "--port", "8000"]
    options = ["--model", "model.pt2", "--max_batch_size", "8", "--batch_timeout", "0.05"]
    options += ["--max_upload_mb", "1", "--max_megapixels", "4", "--upload_timeout", "5"]
    process, port = launch(options, model_pt2.parent)
    yield process, port, model_pt2.parent
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
def test_hostile_uploads_are_refused_while_good_ones_are_answered(
    server, images: list[Path], tmp_path: Path
) -> None:
    """The README's curl gets infer's answer. Then damaged files of every format, a bomb, text,
    the wrong type, a form without a file, stalled uploads and uploads over the limit, sent at
    once among good images (bodies and forms, batched): each gets infer's answer or a 4xx with a
    sentence; the server answers on."""
    _, port, cwd = server
    ask = shlex.split(readme_serving()[2].replace("8000", str(port)))
    assert ask[:3] == ["curl", "-F", "file=@photo.jpg"], ask
    shutil.copy(images[0], photo := cwd / "photo.jpg")
    if shutil.which("curl"):
        answer = json.loads(subprocess.run(ask, cwd=cwd, capture_output=True, check=True).stdout)
    else:  # what it sends
        answer = post(port, *form(photo.read_bytes(), "photo.jpg"))[1]
    assert_infers_answer(answer, infer_answers(cwd / "model.pt2", [photo])[photo])
    png_bomb(bomb := tmp_path / "bomb.png")
    (text := tmp_path / "notes.jpg").write_text("not an image\n" * 50)
    mutants = write_mutants(tmp_path / "mutants", per_kind=1)
    files = [*images, *mutants, bomb, text, write_corrupt(tmp_path / "cut.jpg")]
    expected = infer_answers(cwd / "model.pt2", files)
    jpeg, over = images[0].read_bytes(), b"\xff\xd8" + bytes(8 * MAX_UPLOAD)  # > socket buffers
    Image.new("RGB", (2500, 2000)).save(large := tmp_path / "large.png")  # 5 megapixels, a few kB
    chunks = [b"%x\r\n%s\r\n" % (len(part), part) for part in [over[:65536]] * 20] + [b"0\r\n\r\n"]
    jobs: list[tuple] = [(None, path) for path in files]
    jobs += [
        (415, lambda: post(port, jpeg, None)),
        (422, lambda: post(port, large.read_bytes(), "image/png")),
        (422, lambda: post(port, *form(b"text", filename="a\nb\x00.jpg"))),
        (413, lambda: post(port, over, "image/jpeg")),  # read to its end, then answered
        (413, lambda: post(port, *form(over))),
        (413, lambda: post(port, b"", "image/png", chunks, Transfer_Encoding="chunked")),
        (
            413,
            lambda: post(port, b"", "image/png", Content_Length=len(over), Expect="100-continue"),
        ),
        (408, lambda: post(port, jpeg[:100], "image/jpeg", Content_Length=5000)),  # then nothing
    ]
    random.Random(0).shuffle(jobs)

    def run(job: tuple) -> tuple[int, dict]:
        if job[0] is not None:
            return job[1]()
        data = job[1].read_bytes()
        return post(port, *(form(data) if len(data) % 2 else (data, "image/jpeg")))

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    refused, batches = 0, []
    for (status_wanted, file), (status, answer) in zip(jobs, results, strict=True):
        if status_wanted is None and expected[file] is not None:
            assert status == 200, (file, answer)
            assert_infers_answer(answer, expected[file])
            batches.append(answer["batch_size"])
            continue
        assert status == (status_wanted or 422), (file, answer)
        refused += 1
        assert answer["detail"].isprintable() and "Traceback" not in str(answer)
        assert len(re.findall("image", answer["detail"].split(":")[0])) <= 1, answer  # said once
    assert refused > 40 and max(batches) > 1  # most mutants, the bomb, the text and the others
    detail = post(port, large.read_bytes(), "image/png")[1]["detail"]
    assert detail.endswith("2500x2000 is more than --max_megapixels (4)")
    status, answer = post(port, images[-1].read_bytes(), "image/png")
    assert status == 200 and answer["label"] == expected[images[-1]][0][0]


def assert_sigterm_finishes_the_requests_in_flight(
    process: subprocess.Popen, port: int, data: bytes, expected: list, *, group: bool
) -> None:
    """Four uploads of `data` half sent (and, with `group`, four sent whole) when SIGTERM comes,
    to the server (as Docker and Kubernetes send it) or its whole process group (systemd,
    dumb-init): each gets `infer`'s answer; the server exits 0 and leaves no process."""
    assert len(running_in_group(process.pid, grace=0)) >= 4  # LitServe's manager, worker, HTTP
    with ThreadPoolExecutor(8) as pool:
        jobs = [pool.submit(post, port, data, "image/jpeg") for _ in range(4 * group)]
        # the headers and 100 bytes now, the rest 2 s later, after SIGTERM
        half = (port, b"", "image/jpeg", [data[:100], data[100:]], 2)
        jobs += [pool.submit(post, *half, Content_Length=len(data)) for _ in range(4)]
        time.sleep(1)
        (os.killpg if group else os.kill)(process.pid, signal.SIGTERM)
        answers = [job.result(timeout=120) for job in jobs]
    assert [status for status, _ in answers] == [200] * len(jobs), answers
    for _, answer in answers:
        assert_infers_answer(answer, expected)
    assert process.wait(timeout=120) == 0, server_log(process)
    assert running_in_group(process.pid) == [], server_log(process)


@pytest.mark.slow
def test_an_onnx_model_is_served_and_a_sigterm_to_its_group_finishes_the_requests_in_flight(
    trained_checkpoint: Path, images: list[Path], tmp_path: Path
) -> None:
    """infer's answers, alone and batched; then SIGTERM to every process of the server at once,
    while uploads arrive and a batch waits in the inference worker (1.5 s): each is answered."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name)
    from {{ cookiecutter.package_name }}.commands.export import export_checkpoint

    model = export_checkpoint(trained_checkpoint, tmp_path / "model.onnx", "onnx")
    options = ["--model", str(model), "--batch_timeout", "1.5", "--max_batch_size", "8"]
    process, port = launch(options, tmp_path)
    try:
        everyone = infer_answers(model, images)
        data, expected = images[0].read_bytes(), everyone[images[0]]
        assert post(port, data, "image/jpeg")[1]["batch_size"] == 1  # alone
        bodies = [(p.read_bytes(), "image/jpeg") for p in images[::2]]
        bodies += [form(p.read_bytes()) for p in images[1::2]]
        with ThreadPoolExecutor(8) as pool:  # at once: batched
            answers = list(pool.map(lambda body: post(port, *body), bodies))
        assert max(answer["batch_size"] for _, answer in answers) > 1
        for path, (status, answer) in zip(images[::2] + images[1::2], answers, strict=True):
            assert status == 200, answer
            assert_infers_answer(answer, everyone[path])
        assert_sigterm_finishes_the_requests_in_flight(process, port, data, expected, group=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
def test_the_serving_benchmark_runs(model_pt2: Path, tmp_path: Path) -> None:
    """scripts/serve_bench.py with tiny numbers, so that it cannot rot; it writes nothing."""
    command = [sys.executable, PROJECT / "scripts" / "serve_bench.py", "--model", model_pt2]
    command += ["--requests", "6", "--clients", "1", "3", "--rounds", "2", "--time_limit", "400"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    row = r"^\| (on|off) \| ([13]) \| 6 \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$"
    rows = re.findall(row, done.stdout, re.M)
    assert sorted(rows) == [("off", "1"), ("off", "3"), ("on", "1"), ("on", "3")], done.stdout
    speedup = r"[\d.]+x \([\d.]+-[\d.]+\)"  # over all rounds (the lowest-the highest)
    assert re.search(rf"range\): 1: {speedup}, 3: {speedup}$", done.stdout, re.M), done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sigterm_to_the_readmes_server_finishes_the_requests_in_flight(
    server, images: list[Path]
) -> None:
    """Last here: it stops the module's server."""
    process, port, cwd = server
    expected = infer_answers(cwd / "model.pt2", [images[1]])[images[1]]
    data = images[1].read_bytes()
    assert_sigterm_finishes_the_requests_in_flight(process, port, data, expected, group=False)
