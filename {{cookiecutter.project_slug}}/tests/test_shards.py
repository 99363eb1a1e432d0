"""Shards: `shard` writes a dataset with LitData, `fit --data.source Shards` trains from it, from a
local folder and from a real S3 API server (moto's) on 127.0.0.1, over HTTPS with a throwaway CA.
`shard` runs in this process (the `main` of `python -m`), but for one run through the real CLI."""

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
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error, write_image
from test_mid_epoch import colour_images, interrupted_and_resumed, recorded

from {{ cookiecutter.package_name }}.commands.shard_output import ShardOutput

PACKAGE = "{{ cookiecutter.package_name }}"
needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)
pytestmark = pytest.mark.slow


def shards_own(names: set[str]) -> bool:
    """Whether `names` are all files `shard` writes: LitData's in the split folders, its own."""
    litdata = re.compile(r"(train|val)/(chunk-[\d-]+\.bin|index\.json)")
    own = {"dataset.json", "shard-manifest.json"}
    return all(litdata.fullmatch(name) or name in own for name in names) and own <= names


def from_shards(path: Path | str) -> list[str]:
    """The options that read `path` (a folder or s3://) as the data source."""
    return ["--data.source", "Shards", "--data.source.path", str(path)]


def shard(run_main, root: Path, output: str | Path, *options: str, cwd: Path):
    """`shard` of `root` into `output` with 2 LitData workers, in this process."""
    options = ("--output", str(output), "--data.num_workers", "2", *options)
    return run_main("shard", "--data.source.root", root, *options, cwd=cwd)


@pytest.fixture(scope="module")
def colours(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return colour_images(tmp_path_factory.mktemp("colours"))


@pytest.fixture(scope="module")
def shards(colours: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The colours' shards, by `python -m ... shard` with $TMPDIR holding another job's LitData
    staging files (`<tmp>/chunks`, `<tmp>/data`), which must survive."""
    folder = tmp_path_factory.mktemp("shards")
    for name in ("chunks", "data"):
        (folder / "tmp" / name).mkdir(parents=True)
        (folder / "tmp" / name / "other-job.bin").write_bytes(b"another job's chunk")
    command = [sys.executable, "-m", PACKAGE, "shard", "--data.source.root", str(colours)]
    done = subprocess.run(
        [*command, "--output", str(folder / "out"), "--data.num_workers", "2"],
        cwd=folder,
        env={**os.environ, "TMPDIR": str(folder / "tmp")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "out"


@needs_litdata
def test_shard_writes_shuffled_shards_once_and_asks_before_replacing(
    colours: Path, shards: Path, tmp_path: Path, run_main
) -> None:
    """Training images stored in a seeded random order, not class by class (LitData shuffles only
    within a few chunks); the same shards again are left as they are, others need --overwrite."""
    import litdata

    others = list((shards.parent / "tmp").rglob("other-job.bin"))
    assert len(others) == 2 and {p.read_bytes() for p in others} == {b"another job's chunk"}
    meta = json.loads((shards / "dataset.json").read_text())
    assert meta["class_names"] == ["ant", "bee", "cat"]
    assert meta["images"] == {"train": 24, "val": 6}  # the seeded 20% split, per class
    stored = litdata.StreamingDataset(str(shards / "train"))
    labels = [int(stored[i]["label"]) for i in range(len(stored))]
    assert Counter(labels) == {0: 8, 1: 8, 2: 8}
    assert np.any(np.diff(labels) < 0) and labels != sorted(labels), labels

    again = shard(run_main, colours, shards, cwd=tmp_path)
    assert again.returncode == 0 and "already there" in again.stdout, again.stderr[-3000:]
    smaller = shard(run_main, colours, shards, "--resize", "8", cwd=tmp_path)
    assert "--overwrite" in one_error(smaller.returncode, smaller.stderr)
    assert json.loads((shards / "dataset.json").read_text()) == meta  # left as it was


@needs_litdata
def test_a_run_from_local_shards_resumes_mid_epoch_exactly(
    colours: Path, shards: Path, tmp_path: Path
) -> None:
    """Stopped in epoch 1 by SIGTERM to every process of the job (its loader workers too) and
    resumed with `--ckpt_path last`, as the uninterrupted run: each epoch the same images in the
    same order (LitData's loader state, restored), the same crops and the same final weights."""
    options = [*from_shards(shards), "--data.num_workers", "2"]
    interrupted_and_resumed(colours, tmp_path, options, ranks=1, stop={"TERM_GROUP": "1"})


@needs_litdata
def test_bench_times_the_shards_beside_the_folder(
    colours: Path, shards: Path, tmp_path: Path, run_main
) -> None:
    options = ["--shards", shards, "--data.image_size", "16", "--data.batch_size", "4"]
    options += ["--workers", "[1]", "--epochs", "1", "--json", "bench.json"]
    timed = run_main("bench", "--data.source.root", colours, *options, cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    assert [r["pipeline"] for r in results] == ["naive", "decode", "stream"]
    assert all(r["images_per_s"] > 0 for r in results)
    assert "| stream " in timed.stdout


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 API (moto's server, a separate process) on 127.0.0.1 over HTTPS, a bucket
    `shards`, and the AWS variables that point boto3 and obstore (LitData's clients) at it.
    HTTPS because obstore refuses a plain http:// endpoint; the certificate is signed by a CA
    made here (a self-signed server certificate is refused)."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto", reason="moto[server], in the dev extra")
    folder = tmp_path_factory.mktemp("tls")
    ca, cert, key = _certificates(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    command += ["-c", str(cert), "-k", str(key)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {
        "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CA_BUNDLE": str(ca),
        "SSL_CERT_FILE": str(ca),
    }
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
    """A throwaway CA, and a certificate it signs for 127.0.0.1 and localhost, with its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "throwaway CA")])
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    authority = [
        x509.BasicConstraints(ca=True, path_length=0),
        x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
    ]
    server = [
        x509.BasicConstraints(ca=False, path_length=None),
        x509.SubjectAlternativeName(names),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
    ]
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    made = []
    for name, public, extensions in ((ca_name, ca_key, authority), (server_name, key, server)):
        builder = x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
        builder = builder.public_key(public.public_key()).serial_number(x509.random_serial_number())
        builder = builder.not_valid_before(now - datetime.timedelta(minutes=5))
        builder = builder.not_valid_after(now + datetime.timedelta(days=1))
        for extension in extensions:  # the basic constraints critical, as RFC 5280 asks
            builder = builder.add_extension(extension, critical=extension is extensions[0])
        made.append(builder.sign(ca_key, hashes.SHA256()))
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(made[0].public_bytes(pem))
    paths[1].write_bytes(made[1].public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    return paths


@needs_litdata
def test_shards_on_s3_train_two_processes_and_resume(
    colours: Path, tmp_path: Path, s3, run_main
) -> None:
    """Shard to s3://, then 2-process DDP from there, stopped in epoch 1 and resumed with
    `--ckpt_path last`: each rank trains its own images and ends as the uninterrupted run did;
    then `validate` and `predict` (each image once) from the same shards."""
    unlabelled = tmp_path / "unlabelled"
    for i in range(5):
        write_image(unlabelled / f"u{i}.png", (50 * i, 100, 150))
    predict = ["--data.predict_root", str(unlabelled)]
    done = shard(run_main, colours, "s3://shards/colours", *predict, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = {item["Key"] for item in s3.list_objects_v2(Bucket="shards")["Contents"]}
    assert {"colours/dataset.json", "colours/train/index.json"} <= stored

    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    options = [*ddp, *from_shards("s3://shards/colours"), "--data.num_workers", "1"]
    interrupted_and_resumed(colours, tmp_path, options, ranks=2)
    shares = [recorded(tmp_path / "whole", rank) for rank in (0, 1)]
    for first, second in zip(shares[0].values(), shares[1].values(), strict=True):
        assert len(first) == len(second) and not set(first) & set(second)  # no image on both

    parts = tmp_path / "parts"  # the resumed run's folder; one process from here on
    last = ["--run", "version_0", "--ckpt_path", "last"]
    scored = run_main("validate", *last, "--trainer.enable_progress_bar", "false", cwd=parts)
    assert scored.returncode == 0 and "val_acc" in scored.stdout, scored.stderr[-3000:]
    output = ["--predictions.output", "s3.csv"]
    predicted = run_main("predict", *last, *from_shards("s3://shards/colours"), *output, cwd=parts)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    with open(parts / "s3.csv", newline="") as file:
        paths = [row[0] for row in list(csv.reader(file))[1:]]
    assert sorted(paths) == [f"u{i}.png" for i in range(5)]  # each image once


@needs_litdata
def test_an_s3_prefix_of_shards_own_objects_is_replaced_whole(
    colours: Path, tmp_path: Path, s3, run_main
) -> None:
    """Beside a user's object (refused, then written beside it under `--overwrite`), more chunks
    of shard's own, as a longer run leaves them: replaced by `--overwrite`, and in the folder a
    killed run had claimed, by the next run. Every one goes; the user's object stays."""
    url, prefix, bucket = "s3://shards/many", "many/", "shards"
    s3.put_object(Bucket=bucket, Key=f"{prefix}notes.txt", Body=b"the user's")
    refused = shard(run_main, colours, url, cwd=tmp_path)
    assert "holds files that shard did not write" in one_error(refused.returncode, refused.stderr)
    done = shard(run_main, colours, url, "--overwrite", "true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    def keys() -> set[str]:
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {item["Key"][len(prefix) :] for page in pages for item in page.get("Contents", [])}

    for finished, options in ((True, ["--overwrite", "true"]), (False, [])):
        old = [f"train/chunk-9-{i}.bin" for i in range(40)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda key: s3.put_object(Bucket=bucket, Key=prefix + key), old))
        if not finished:  # as a run killed while writing leaves it
            s3.delete_object(Bucket=bucket, Key=f"{prefix}dataset.json")
        resize = "8" if finished else "12"
        replaced = shard(run_main, colours, url, "--resize", resize, *options, cwd=tmp_path)
        assert replaced.returncode == 0, replaced.stderr[-3000:]
        assert shards_own(keys() - {"notes.txt"}) and "notes.txt" in keys()
        assert not set(old) & keys() and "train/index.json" in keys()
        meta = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}dataset.json")["Body"].read())
        assert meta["made_of"]["resize"] == int(resize) and meta["images"] == {
            "train": 24,
            "val": 6,
        }


@needs_litdata
def test_s3_lists_and_deletes_go_a_page_of_at_most_1000_keys_at_a_time(s3) -> None:
    """moto deletes any number of keys in one request, S3 at most 1,000: counted here."""
    names = [f"train/chunk-0-{i}.bin" for i in range(1500)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda name: s3.put_object(Bucket="shards", Key=f"paged/{name}"), names))
    output, sizes = ShardOutput("s3://shards/paged"), []
    delete = output.s3.delete_objects

    def counted(**request):
        sizes.append(len(request["Delete"]["Objects"]))
        return delete(**request)

    output.s3.delete_objects = counted
    assert len(output.files()) == 1500  # listed a page of 1,000 at a time too
    output.remove(set(names))
    assert sizes == [1000, 500] and output.files() == []


@pytest.mark.skipif(find_spec("litdata") is not None, reason="this bake has the stream extra")
def test_without_litdata_the_stream_options_name_the_extra(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    for command in (
        ["fit", *from_shards("shards")],
        ["shard", "--data.source.root", "images", "--output", "shards"],
    ):
        run = subprocess.run(
            [sys.executable, "-m", PACKAGE, *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert 'pip install ".[stream]"' in one_error(run.returncode, run.stderr), command
