"""Shards: `shard` writes a dataset with LitData, `fit --data.source Shards` trains from it, from a
local folder and from a real S3 API server (moto's) on 127.0.0.1, over HTTPS with a throwaway CA."""

from __future__ import annotations

import csv
import datetime
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from conftest import one_error, write_image
from test_mid_epoch import colour_root as colour_root  # the fixture, shared
from test_mid_epoch import interrupted_and_resumed

PACKAGE = "{{ cookiecutter.package_name }}"
needs_litdata = pytest.mark.skipif(
    find_spec("litdata") is None, reason='the stream extra: pip install ".[stream]"'
)


def from_shards(path: Path | str) -> list[str]:
    """The options that read `path` (a folder or s3://) as the data source."""
    return ["--data.source", "Shards", "--data.source.path", str(path)]


def shard(root: Path, output: str, *options: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", PACKAGE, "shard", "--data.source.root", str(root)]
    return subprocess.run(
        [*command, "--output", output, "--data.num_workers", "2", *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@needs_litdata
def test_shard_writes_once_and_asks_before_replacing(
    colour_root: Path, tmp_path: Path, run_main
) -> None:
    out = tmp_path / "shards"
    done = shard(colour_root, str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["class_names"] == ["ant", "bee", "cat"]
    assert meta["images"] == {"train": 24, "val": 6}  # the seeded 20% split, per class
    assert (out / "train/index.json").is_file() and (out / "val/index.json").is_file()

    # Where nothing is written (in this process): the same shards again, or a refusal.
    same = ["shard", "--data.source.root", colour_root, "--output", out, "--data.num_workers", "2"]
    again = run_main(*same, cwd=tmp_path)
    assert again.returncode == 0 and "already there" in again.stdout, again.stderr[-3000:]
    smaller = run_main(*same, "--resize", "8", cwd=tmp_path)
    assert "--overwrite" in one_error(smaller.returncode, smaller.stderr)
    assert json.loads((out / "dataset.json").read_text()) == meta  # left as it was
    replaced = shard(colour_root, str(out), "--resize", "8", "--overwrite", "true", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads((out / "dataset.json").read_text())["made_of"]["resize"] == 8


@pytest.mark.slow
@needs_litdata
def test_incomplete_shards_are_refused_and_rewritten(
    colour_root: Path, tmp_path: Path, run_main
) -> None:
    out = tmp_path / "shards"
    assert shard(colour_root, str(out), cwd=tmp_path).returncode == 0
    (out / "dataset.json").unlink()  # as a run killed before its end leaves them
    refused = run_main("fit", *from_shards(out), cwd=tmp_path)
    error = one_error(refused.returncode, refused.stderr)
    assert "no complete shards" in error and str(out) in error
    done = shard(colour_root, str(out), cwd=tmp_path)
    assert done.returncode == 0 and "wrote 24 train, 6 val" in done.stdout, done.stderr[-3000:]


@needs_litdata
@pytest.mark.slow
def test_a_run_from_local_shards_resumes_mid_epoch_exactly(
    colour_root: Path, tmp_path: Path
) -> None:
    """Uninterrupted, then stopped by SIGTERM in epoch 1 and resumed with `--ckpt_path last`:
    each epoch the same images in the same order (LitData's loader state, restored), the same
    crops and the same final weights."""
    out = tmp_path / "shards"
    assert shard(colour_root, str(out), cwd=tmp_path).returncode == 0
    options = [*from_shards(out), "--data.num_workers", "2"]
    interrupted_and_resumed(colour_root, tmp_path, options, ranks=1)


@pytest.mark.slow
@needs_litdata
def test_bench_times_the_shards_beside_the_folder(colour_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "shards"
    assert shard(colour_root, str(out), cwd=tmp_path).returncode == 0
    command = [sys.executable, "-m", PACKAGE, "bench", "--data.source.root", str(colour_root)]
    options = ["--shards", str(out), "--data.image_size", "16", "--data.batch_size", "4"]
    timed = subprocess.run(
        [*command, *options, "--workers", "[1]", "--epochs", "1", "--json", "bench.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert timed.returncode == 0, timed.stderr[-3000:]
    results = json.loads((tmp_path / "bench.json").read_text())
    assert [r["pipeline"] for r in results] == ["naive", "decode", "stream"]
    assert all(r["images_per_s"] > 0 for r in results)
    assert all(r["worker_pss_mib"] > 0 for r in results)  # LitData's workers measured too
    assert "| stream " in timed.stdout


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 API (moto's server, a separate process) on 127.0.0.1 over HTTPS, a bucket
    `shards`, and the AWS variables that point boto3 and obstore (LitData's clients) at it.

    HTTPS because LitData's uploads go through obstore, which refuses a plain http:// endpoint;
    its certificate is signed by a CA made here (a self-signed server certificate is refused).
    """
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto", reason="moto[server], in the dev extra")
    folder = tmp_path_factory.mktemp("tls")
    ca, cert, key = _certificates(folder)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(
        [*command, "-c", str(cert), "-k", str(key)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CA_BUNDLE": str(ca),
        "SSL_CERT_FILE": str(ca),
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
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
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA, and a certificate it signs for 127.0.0.1 and localhost, with its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def certificate(subject: str, key, issuer: str, issuer_key, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate(
        "throwaway test CA",
        ca_key,
        "throwaway test CA",
        ca_key,
        [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ],
    )
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = certificate(
        "127.0.0.1",
        server_key,
        "throwaway test CA",
        ca_key,
        [
            (x509.SubjectAlternativeName(names), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
        ],
    )
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    key_format = serialization.PrivateFormat.PKCS8
    paths[2].write_bytes(server_key.private_bytes(pem, key_format, serialization.NoEncryption()))
    return paths


@needs_litdata
@pytest.mark.slow
def test_shards_on_s3_train_two_processes_on_disjoint_images_and_resume(
    colour_root: Path, tmp_path: Path, s3, run_main
) -> None:
    """Shard to s3://, then 2-process DDP from there: each rank trains on its own images, none
    shared; stopped in epoch 1 and resumed with `--ckpt_path last`, each rank ends as the
    uninterrupted run did; then `validate` and `predict` from the same shards."""
    unlabelled = tmp_path / "unlabelled"
    for i in range(5):
        write_image(unlabelled / f"u{i}.png", (50 * i, 100, 150))
    predict = ["--data.predict_root", str(unlabelled)]
    done = shard(colour_root, "s3://shards/colours", *predict, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    stored = {item["Key"] for item in s3.list_objects_v2(Bucket="shards")["Contents"]}
    assert {"colours/dataset.json", "colours/train/index.json"} <= stored

    ddp = ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    options = [*ddp, *from_shards("s3://shards/colours"), "--data.num_workers", "1"]
    interrupted_and_resumed(colour_root, tmp_path, options, ranks=2)

    parts = tmp_path / "parts"  # the resumed run's folder; one process from here on
    last = ["--run", "version_0", "--ckpt_path", "last"]
    scored = run_main("validate", *last, "--trainer.enable_progress_bar", "false", cwd=parts)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "val_acc" in scored.stdout
    output = ["--predictions.output", "s3.csv"]
    predicted = run_main("predict", *last, *from_shards("s3://shards/colours"), *output, cwd=parts)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    with open(parts / "s3.csv", newline="") as file:
        paths = [row[0] for row in list(csv.reader(file))[1:]]
    assert sorted(paths) == [f"u{i}.png" for i in range(5)]  # each image once


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
