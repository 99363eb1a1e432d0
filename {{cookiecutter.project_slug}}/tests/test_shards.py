"""Shards: `shard` writes a dataset with LitData, `fit --data.source Shards` trains from it, from a
local folder and from a real S3 API server (moto's) on 127.0.0.1, over HTTPS with a throwaway CA;
`validate`, `test` and `predict` from shards give what the folders give, with DDP too."""

from __future__ import annotations

import csv
import datetime
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from importlib.util import find_spec
from pathlib import Path
from subprocess import CompletedProcess

import numpy as np
import pytest
from conftest import CLASSES, one_error, write_image
from test_mid_epoch import colour_images, recorded, stopped_and_resumed, whole_run

from {{ cookiecutter.package_name }}.__main__ import main

PACKAGE = "{{ cookiecutter.package_name }}"
needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)
pytestmark = pytest.mark.slow
NO_SANITY = ["--trainer.num_sanity_val_steps", "0"]  # each fit's validation loader starts once
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
DDP = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]


def shards_own(names: set[str]) -> bool:  # all of them files that `shard` writes
    litdata = re.compile(r"(train|val)/(chunk-[\d-]+\.bin|index\.json)")
    own = {"dataset.json", "shard-manifest.json"}
    return all(litdata.fullmatch(name) or name in own for name in names) and own <= names


def from_shards(path: Path | str) -> list[str]:
    return ["--data.source", "Shards", "--data.source.path", str(path)]


def shard(run_main, root: Path, output: str | Path, *options: str, cwd: Path):  # 2 workers
    options = ("--output", str(output), "--data.num_workers", "2", *options)
    return run_main("shard", "--data.source.root", root, *options, cwd=cwd)


@pytest.fixture(scope="module")
def colours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return colour_images(tmp_path_factory.mktemp("colours"))


@pytest.fixture(scope="module")
def shards(colours: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The colours' shards and 5 unlabelled images' (`<its folder>/unlabelled`), with the temporary
    folder holding another job's LitData staging files (`<tmp>/chunks`, `<tmp>/data`), which must
    survive."""
    folder = tmp_path_factory.mktemp("shards")
    for name in ("chunks", "data"):
        (folder / "tmp" / name).mkdir(parents=True)
        (folder / "tmp" / name / "other-job.bin").write_bytes(b"another job's chunk")
    for i in range(5):
        write_image(folder / "unlabelled" / f"u{i}.png", (50 * i, 100, 150))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(folder / "tmp"))  # LitData's workers fork
        options = ["--data.predict_root", f"{folder}/unlabelled", "--output", f"{folder}/out"]
        main(["shard", "--data.source.root", str(colours), *options])
    return folder / "out"


@needs_litdata
def test_shard_writes_training_images_in_a_seeded_random_order(shards: Path) -> None:
    """Not class by class: LitData shuffles only within a few chunks."""
    import litdata

    others = list((shards.parent / "tmp").rglob("other-job.bin"))
    assert len(others) == 2 and {p.read_bytes() for p in others} == {b"another job's chunk"}
    meta = json.loads((shards / "dataset.json").read_text())
    assert meta["class_names"] == ["ant", "bee", "cat"]
    assert meta["images"] == {"train": 24, "val": 6, "predict": 5}  # a seeded 20% split
    stored = litdata.StreamingDataset(str(shards / "train"))
    labels = [int(stored[i]["label"]) for i in range(len(stored))]
    assert Counter(labels) == {0: 8, 1: 8, 2: 8}
    assert np.any(np.diff(labels) < 0) and labels != sorted(labels), labels


@needs_litdata
def test_bench_times_the_shards_beside_the_folder(
    colours: Path, shards: Path, tmp_path: Path, run_main
) -> None:
    options = ["--shards", shards, "--data.image_size", "16", "--data.batch_size", "4"]
    options += ["--workers", "[1]", "--epochs", "1"]
    timed = run_main("bench", "--data.source.root", colours, *options, cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr[-3000:]
    rows = re.findall(r"^\| (\w+) +\| +1 \| +\d+ \|", timed.stdout, re.MULTILINE)
    assert rows == ["naive", "decode", "stream"], timed.stdout


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 API (moto's server) on 127.0.0.1, a bucket `shards`, and the AWS variables that
    point boto3 and obstore (LitData's clients) at it; HTTPS, as obstore refuses http://."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto", reason="moto[server], in the dev extra")
    ca, cert, key = _certificates(tmp_path_factory.mktemp("tls"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    command += ["-c", str(cert), "-k", str(key)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(AWS_ENDPOINT_URL=f"https://127.0.0.1:{port}", AWS_DEFAULT_REGION="us-east-1")
    env |= dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    env |= dict(AWS_CA_BUNDLE=str(ca), SSL_CERT_FILE=str(ca))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    boto3.client("s3").create_bucket(Bucket="shards")
                    break
                except Exception:
                    assert server.poll() is None and time.monotonic() < deadline, "no S3 server"
                    time.sleep(0.2)
            yield boto3.client("s3")
        finally:
            server.terminate()
            server.wait(30)


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA (obstore refuses a self-signed server certificate), and a certificate it
    signs for 127.0.0.1, with its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now, day = datetime.datetime.now(datetime.UTC), datetime.timedelta(days=1)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca, server = (x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, n)]) for n in ("CA", "server"))
    authority = [x509.BasicConstraints(ca=True, path_length=0)]
    authority += [x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())]
    ip = [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    own = [x509.BasicConstraints(ca=False, path_length=None), x509.SubjectAlternativeName(ip)]
    own += [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])]
    own += [x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())]
    made = []
    for name, public, extensions in ((ca, ca_key, authority), (server, key, own)):
        serial, public = x509.random_serial_number(), public.public_key()
        builder = x509.CertificateBuilder(ca, name, public, serial, now - day, now + day)
        for extension in extensions:  # the basic constraints critical, as RFC 5280 asks
            builder = builder.add_extension(extension, critical=extension is extensions[0])
        made.append(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    pkcs8, plain = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    made.append(key.private_bytes(serialization.Encoding.PEM, pkcs8, plain))
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    for path, content in zip(paths, made, strict=True):
        path.write_bytes(content)
    return paths


@needs_litdata
def test_shards_train_two_processes_from_a_folder_and_from_s3_and_resume(
    colours: Path, shards: Path, tmp_path: Path, s3, run_main
) -> None:
    """2-process DDP from the local shards: each rank trains its own images. The same shards on
    S3: stopped in epoch 1 by SIGTERM to every process of the job (LitData's loader workers too)
    and resumed with `--ckpt_path last`, it ends as the run from the folder (the same images in the
    same order, crops, weights and metrics). Then `predict` from S3 (each image once)."""
    for path in (path for path in shards.rglob("*") if path.is_file()):
        s3.upload_file(str(path), "shards", f"colours/{path.relative_to(shards).as_posix()}")
    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    options = [*ddp, "--data.num_workers", "1", "--trainer.max_epochs", "2", *NO_SANITY]
    whole = whole_run(colours, tmp_path / "whole", [*options, *from_shards(shards)])
    shares = [recorded(whole, rank) for rank in (0, 1)]
    for first, second in zip(shares[0].values(), shares[1].values(), strict=True):
        assert len(first) == len(second) and not set(first) & set(second)  # no image on both
    (parts := tmp_path / "parts").mkdir()
    options += from_shards("s3://shards/colours")
    stopped_and_resumed(colours, parts, whole, options, [{"TERM_GROUP": "1"}], ranks=2)

    last = ["--run", "version_0", "--ckpt_path", "last", *from_shards("s3://shards/colours")]
    predicted = run_main("predict", *last, "--predictions.output", "s3.csv", cwd=parts)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    with open(parts / "s3.csv", newline="") as file:
        paths = [row[0] for row in list(csv.reader(file))[1:]]
    assert sorted(paths) == [f"u{i}.png" for i in range(5)]  # each image once


@needs_litdata
def test_an_s3_prefix_of_shards_own_objects_is_replaced_whole(
    colours: Path, tmp_path: Path, s3, run_main
) -> None:
    """A user's object there: refused, left as it was. Chunks of shard's own, of a finished run and
    of a killed one (no dataset.json), are replaced whole by the next run."""
    url, prefix, bucket = "s3://shards/many", "many/", "shards"
    s3.put_object(Bucket=bucket, Key=f"{prefix}notes.txt", Body=b"the user's")
    refused = shard(run_main, colours, url, cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert f"holds {url}/notes.txt, which shard did not write" in error, error
    s3.delete_object(Bucket=bucket, Key=f"{prefix}notes.txt")

    def keys() -> set[str]:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return {item["Key"][len(prefix) :] for item in listed}

    for finished in (None, True, False):
        old = [f"train/chunk-9-{i}.bin" for i in range(3)] if finished is not None else []
        for key in old:
            s3.put_object(Bucket=bucket, Key=prefix + key)
        if finished is False:  # as a run killed while writing leaves it
            s3.delete_object(Bucket=bucket, Key=f"{prefix}dataset.json")
        replaced = shard(run_main, colours, url, "--resize", "8", cwd=tmp_path)
        assert replaced.returncode == 0, replaced.stderr[-3000:]
        assert shards_own(keys()) and not set(old) & keys() and "train/index.json" in keys()
        meta = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}dataset.json")["Body"].read())
        assert meta["images"]["train"] == 24


@needs_litdata
def test_s3_lists_and_deletes_go_a_page_at_a_time(s3, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 deletes at most `PAGE` (1,000) keys per request, moto any number: counted, with 2."""
    from {{ cookiecutter.package_name }}.data import shards as shard_output

    monkeypatch.setattr(shard_output, "PAGE", 2)
    names = [f"train/chunk-0-{i}.bin" for i in range(5)]
    for name in names:
        s3.put_object(Bucket="shards", Key=f"paged/{name}")
    output, sizes = shard_output.ShardOutput("s3://shards/paged"), []
    delete = output.s3.delete_objects

    def counted(**request):
        sizes.append(len(request["Delete"]["Objects"]))
        return delete(**request)

    output.s3.delete_objects = counted
    assert output.files() == names
    output.remove(set(names))
    assert sizes == [2, 2, 1] and output.files() == []


@pytest.fixture
def eval_sets(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The colour images, 11 test images in the three classes, 7 unlabelled ones (some nested)."""
    test_root, predict_root = tmp_path / "test", tmp_path / "unlabelled"
    for i in range(11):
        colour = tuple(255 if c == i % 3 else 30 for c in range(3))
        write_image(test_root / CLASSES[i % 3] / f"t{i}.jpg", colour)
    for i in range(7):
        write_image(predict_root / ("nested" if i % 2 else "") / f"u{i}.png", (40 * i, 90, 160))
    return colour_images(tmp_path / "colours"), test_root, predict_root


def cli(command: str, checkpoint: Path, *options: str, cwd: Path, run_main) -> CompletedProcess:
    """The command on a checkpoint: in this process, or under DDP in new ones (Lightning starts
    the other from the command line), there with no loader workers (a rank's share is LitData's)."""
    data = ["--data.image_size", "16", "--data.batch_size", "4", "--data.num_workers", "1"]
    args = [command, "--ckpt_path", str(checkpoint), *data, *QUIET, *options]
    if "--trainer.devices" not in options:
        run = run_main(*args, cwd=cwd)
    else:
        command = [sys.executable, "-m", PACKAGE, *args, "--data.num_workers", "0"]
        run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def scores(run: CompletedProcess) -> dict[str, float]:
    """The metrics of Lightning's results table (boxes where `rich` is installed, else columns)."""
    row = r"^[│|\s]*(\w+_(?:acc|loss))[│|\s]+([-+.0-9eE]+)[│|\s]*$"
    found = re.findall(row, run.stdout, flags=re.MULTILINE)
    assert found, run.stdout[-3000:]
    return {name: float(value) for name, value in found}


def predictions(path: Path, root: Path | None = None) -> dict[str, list[str]]:
    """The predictions CSV as {path relative to `root`: [label, probability, top_k]}."""
    with open(path, newline="") as file:
        rows = list(csv.reader(file))[1:]
    named = {os.path.relpath(row[0], root) if root else row[0]: row[1:] for row in rows}
    assert len(named) == len(rows), "an image predicted twice"
    return named


@needs_litdata
def test_test_and_predict_from_shards_match_the_folders_in_one_process_and_two(
    eval_sets: tuple[Path, Path, Path], trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    """`test` scores and `predict` labels from shards as from the folders, with 2 processes (DDP)
    too, each image once: 7 to predict, fewer than 2 batches of 4; 11 to test, an odd number."""
    colours, test_root, predict_root = eval_sets
    out = tmp_path / "shards"
    sets = ["--data.source.test_root", str(test_root), "--data.predict_root", str(predict_root)]
    done = shard(run_main, colours, out, *sets, cwd=tmp_path)
    assert done.returncode == 0 and "11 test, 7 predict" in done.stdout, done.stderr[-3000:]
    stream = from_shards(out)

    def run(command: str, *options: str) -> CompletedProcess:
        return cli(command, trained_checkpoint, *options, cwd=tmp_path, run_main=run_main)

    from_folder = scores(run("test", *sets[:2]))
    assert set(from_folder) == {"test_acc", "test_loss"}
    for processes in ([], DDP):
        got = scores(run("test", *stream, *processes))
        assert got == pytest.approx(from_folder, rel=1e-5), processes

    folder_csv = tmp_path / "folder.csv"
    run("predict", *sets[2:], "--predictions.output", str(folder_csv))
    expected = predictions(folder_csv, predict_root)
    assert len(expected) == 7
    for processes in ([], DDP):
        run("predict", *stream, *processes, "--predictions.output", str(tmp_path / "stream.csv"))
        assert predictions(tmp_path / "stream.csv") == expected, processes
    one = scores(run("validate", "--data.source.root", str(colours)))
    assert scores(run("validate", *stream)) == pytest.approx(one, rel=1e-5)  # the same 6 images


@needs_litdata
def test_evaluation_needs_its_split_and_refuses_folder_only_options(
    eval_sets: tuple[Path, Path, Path], trained_checkpoint: Path, tmp_path: Path, run_main
) -> None:
    """Without their sets, `test` and `predict` name the option that adds them. A folder-only
    option stops a run before it starts."""
    out = tmp_path / "shards"
    assert shard(run_main, eval_sets[0], out, cwd=tmp_path).returncode == 0
    run = run_main("fit", *from_shards(out), "--data.source.cache", "memmap", cwd=tmp_path)
    assert '"data.source"' in one_error(run.returncode, run.stderr)
    assert f"class_path '{PACKAGE}.data.sources.Shards'" in run.stderr, run.stderr[-3000:]
    assert "Option 'cache' is not accepted" in run.stderr, run.stderr[-3000:]
    assert not (tmp_path / "lightning_logs").exists()  # nothing started
    checkpoint = ["--ckpt_path", str(trained_checkpoint), *from_shards(out), *QUIET]
    sets = {"test": "--data.source.test_root", "predict": "--data.predict_root"}
    for command, option in sets.items():
        run = run_main(command, *checkpoint, cwd=tmp_path)
        error = one_error(run.returncode, run.stderr)
        assert f"holds no {command} images" in error and option in error, error


@pytest.mark.skipif(find_spec("litdata") is not None, reason="this bake has the stream extra")
def test_without_litdata_the_stream_options_name_the_extra(tmp_path: Path, run_main) -> None:
    (tmp_path / "images").mkdir()
    for command in (
        ["fit", *from_shards("shards")],
        ["shard", "--data.source.root", "images", "--output", "shards"],
    ):
        run = run_main(*command, cwd=tmp_path)
        assert 'pip install ".[stream]"' in one_error(run.returncode, run.stderr), command
