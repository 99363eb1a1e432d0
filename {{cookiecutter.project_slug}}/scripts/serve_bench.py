"""Requests per second and latency of `serve`, with batching on and off, for 1, 8 and 32 clients.

`python scripts/serve_bench.py --model model.pt2 [--requests 512] [--clients 1 8 32] [--rounds 4]`

Starts two servers itself, on 127.0.0.1 and free ports: one with batching off
(`--max_batch_size 1`), one with it on (`--max_batch_size 32 --batch_timeout 0.01`). For each
number of clients, that many threads, each with one keep-alive connection, send `--requests`
POSTs in all to each server of one photo-sized JPEG (500x375, as the body), after one request
each to warm up. The requests go in `--rounds` rounds, off then on, on then off, and so on, so
that a change in the machine's load meanwhile falls on both alike. Prints a Markdown table
(requests/s, p50 and p99 latency) and batching's speed-up in requests/s, with its lowest and
highest over the rounds. Stops after `--time_limit` seconds with what it has measured. The
clients share the machine with the servers: on a small CPU they take part of it. A benchmark, not
a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import io
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager

import numpy as np
from PIL import Image

PACKAGE = "{{ cookiecutter.package_name }}"
SETTINGS = {
    "off": ["--max_batch_size", "1"],
    "on": ["--max_batch_size", "32", "--batch_timeout", "0.01"],
}


def photo_jpeg(width: int = 500, height: int = 375) -> bytes:
    """A photo-like JPEG: gradients and noise, so that it compresses as photos do."""
    ys, xs = np.mgrid[0:height, 0:width]
    pixels = np.stack([xs * 255 / width, ys * 255 / height, np.full(xs.shape, 128.0)], axis=-1)
    noise = np.random.default_rng(0).normal(0, 12, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


@contextmanager
def served(model: str, deadline: float):
    """A `serve` process for each of SETTINGS on a free port of 127.0.0.1, started at once, then
    ready: {setting: port}; stopped with SIGTERM after."""
    with ExitStack() as stack:
        servers = {}
        stack.callback(stop, servers)
        for batching, options in SETTINGS.items():
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            command = [sys.executable, "-m", PACKAGE, "serve", "--model", model, *options]
            command += ["--host", "127.0.0.1", "--port", str(port), "--log_level", "warning"]
            log = stack.enter_context(tempfile.TemporaryFile())
            process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
            servers[batching] = (process, port, log)
        for process, port, log in servers.values():
            while not healthy(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    sys.exit(f"error: serve did not start: {log.read()[-2000:].decode()}")
                time.sleep(0.5)
        yield {batching: port for batching, (_, port, _) in servers.items()}


def stop(servers: dict) -> None:
    """SIGTERM to each server at once; then, to one still running after 60 s, SIGKILL."""
    for process, _, _ in servers.values():
        process.send_signal(signal.SIGTERM)
    for process, _, _ in servers.values():
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def healthy(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


def measure(port: int, image: bytes, clients: int, requests: int, deadline: float) -> dict:
    """The latencies, wall time and requests/s of `requests` POSTs from `clients` threads at
    once."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    left = [requests]
    ready = threading.Barrier(clients + 1)

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"Content-Type": "image/jpeg"}
        connection.request("POST", "/predict", image, headers)  # warm-up, not counted
        connection.getresponse().read()
        ready.wait()
        while time.monotonic() < deadline:
            with lock:
                if left[0] == 0:
                    break
                left[0] -= 1
            start = time.perf_counter()
            connection.request("POST", "/predict", image, headers)
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if response.status != 200:
                    failures.append(str(response.status))
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if failures:
        sys.exit(f"error: {len(failures)} requests failed, with status {failures[0]}")
    return {"latencies": latencies, "wall": wall, "per_s": len(latencies) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a model written by export")
    parser.add_argument("--requests", type=int, default=512, help="per setting (512)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=4, help="off and on in turn (4)")
    parser.add_argument("--time_limit", type=float, default=900, help="seconds in all (900)")
    options = parser.parse_args()
    deadline = time.monotonic() + options.time_limit
    image = photo_jpeg()
    load = os.getloadavg()[0]
    # results[batching, clients]: one measurement per round
    results: dict[tuple[str, int], list[dict]] = {}
    with served(options.model, deadline) as ports:
        for clients in options.clients:
            for turn in range(options.rounds):
                order = list(SETTINGS) if turn % 2 == 0 else list(reversed(SETTINGS))
                requests = len(range(turn, options.requests, options.rounds))  # its share
                for batching in order:
                    if time.monotonic() < deadline and requests:
                        row = measure(ports[batching], image, clients, requests, deadline)
                        results.setdefault((batching, clients), []).append(row)
    print(
        f"{options.model}, a {len(image) // 1024} KB JPEG of 500x375, {os.cpu_count()} CPUs, "
        f"{options.rounds} rounds, load average {load:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after"
    )
    print("| batching | clients | requests | requests/s | p50 ms | p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for batching in SETTINGS:
        for clients in options.clients:
            if rounds := results.get((batching, clients)):
                row = pooled(rounds)
                print(
                    f"| {batching} | {clients} | {row['requests']} | {row['per_s']:.1f} "
                    f"| {row['p50']:.1f} | {row['p99']:.1f} |"
                )
    speedups = []
    for clients in options.clients:
        off, on = results.get(("off", clients), []), results.get(("on", clients), [])
        if off and on:
            ratio = pooled(on)["per_s"] / pooled(off)["per_s"]
            each = [b["per_s"] / a["per_s"] for a, b in zip(off, on, strict=False)]
            speedups.append(f"{clients}: {ratio:.2f}x ({min(each):.2f}-{max(each):.2f})")
    print("batching on / off, requests/s, by clients (rounds' range): " + ", ".join(speedups))
    if time.monotonic() >= deadline:
        sys.exit(f"error: stopped at --time_limit {options.time_limit:g} s, before the end")


def pooled(rounds: list[dict]) -> dict:
    """The rounds of one setting as one measurement: all requests over all their time."""
    latencies = [latency for row in rounds for latency in row["latencies"]]
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "requests": len(latencies),
        "per_s": len(latencies) / sum(row["wall"] for row in rounds),
        "p50": 1000 * statistics.median(latencies),
        "p99": 1000 * cuts[98],
    }


if __name__ == "__main__":
    main()
