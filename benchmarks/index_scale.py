"""Building the index at scale: labels CSVs of 100k and 1M rows, class-folder trees as large.

    PYTHONPATH=<bake>/src python benchmarks/index_scale.py <package> [--rounds 5] [--dir DIR] \
        [--rows 100000 1000000] [--against PACKAGE]

Writes the inputs once under DIR (default build/bench/index): labels CSVs of 100k and 1M rows
(`class_042/img_00001234.jpg,class_042`, classes drawn at random) and, as empty files in 100
class folders, the files that each CSV names (a million empty files: about a minute, once).
Times, in alternating rounds so that both see the same machine minutes, the baseline (BASELINE
below: a copy of the index code before it was vectorised, a csv-module reader, os.walk listing and
`np.isin` on path strings) against the bake's `data/index.py`:
`read_labels_csv` + `targets`, `make_dataset` on each tree, and `find_missing` of the 100k
CSV against its tree (also against the simplest check, a `stat` per row); with --against, the CSV
reading of another bake too (of an earlier commit, say, on PYTHONPATH beside the first). Prints
median wall and CPU seconds and old/new (CPU time is the steadier on a shared machine), the bytes
of the index arrays (the same for both), and the peak heap of one 1M-row read (tracemalloc, which
counts numpy's arrays). Where fresh memory is dear (a VM where numpy's huge-page advice on large
arrays costs system time once the baseline has freed its heap), NUMPY_MADVISE_HUGEPAGE=0 shows the
difference that makes.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import io
import os
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

CLASSES = 100


# ---- BASELINE: the index code as it was before vectorising (commit faebfd3), kept to compare. ----
def baseline_read_labels_csv(module, csv_file: Path) -> object:
    """Old `read_labels_csv`: the csv module, a Python list per row, a set for duplicates."""
    raw = csv_file.read_bytes()
    text = raw.decode("utf-8-sig")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = next(reader)
    records = list(reader)
    lines = np.arange(2, len(records) + 2)
    columns = [name.strip() for name in header]
    file_at, label_at = columns.index("filename"), columns.index("label")
    names = [row[file_at].strip().encode() for row in records]
    labels = [row[label_at].strip() for row in records]
    found: dict[str, int] = {}
    codes = np.array([found.setdefault(label, len(found)) for label in labels], dtype=np.int64)
    paths = np.array(names, dtype=np.bytes_)
    table = module.LabelsTable(csv_file, paths, list(found), codes, lines)
    if (table.paths == b"").any() or "" in found or len(set(names)) < len(names):
        raise ValueError(f"{csv_file}: the benchmark's CSV should have no bad rows")
    return table


def baseline_list_files(folder: Path, images_only: bool, extensions: tuple[str, ...]) -> list[str]:
    """Old `_list_files`: os.walk, and an os.path.join per file."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__MACOSX")
        rel = os.path.relpath(dirpath, folder)
        for name in sorted(filenames):
            if images_only and (name.startswith(".") or not name.lower().endswith(extensions)):
                continue
            found.append(name if rel == "." else os.path.join(rel, name))
    return found


def baseline_make_dataset(root: Path, class_to_idx: dict[str, int], extensions: tuple[str, ...]):
    """Old `make_dataset`: a bytes object per file, then np.array of the list."""
    paths: list[bytes] = []
    targets: list[int] = []
    for name in class_to_idx:
        files = baseline_list_files(root / name, True, extensions)
        paths.extend(os.fsencode(os.path.join(name, f)) for f in files)
        targets.extend([class_to_idx[name]] * len(files))
    return np.array(paths, dtype=np.bytes_), np.array(targets, dtype=np.int64)


def baseline_find_missing(table, root: Path, extensions: tuple[str, ...]) -> None:
    """Old `find_missing`: `np.isin` on the path strings."""
    listed = baseline_list_files(root, False, extensions)
    present = np.array([os.fsencode(p) for p in listed], np.bytes_)
    unmatched = np.flatnonzero(~np.isin(table.paths, present))
    if any(not os.path.isfile(os.path.join(root, os.fsdecode(table.paths[r]))) for r in unmatched):
        raise ValueError("the benchmark's CSV should name only files in the tree")


# ---- end of BASELINE ----


def stat_per_row(table, root: Path) -> None:
    """The simplest `find_missing`: a `stat` per row, the alternative to one listing of the tree."""
    if any(not os.path.isfile(os.path.join(root, os.fsdecode(p))) for p in table.paths.tolist()):
        raise ValueError("the benchmark's CSV should name only files in the tree")


def write_inputs(folder: Path, small: int, large: int) -> tuple[dict[int, Path], dict[int, Path]]:
    """The CSVs, and for each the tree of the files that it names."""
    folder.mkdir(parents=True, exist_ok=True)
    csvs = {}
    for rows in (small, large):
        csvs[rows] = folder / f"labels_{rows}.csv"
        if not csvs[rows].exists():
            classes = np.random.default_rng(rows).integers(0, CLASSES, rows)
            names = (f"class_{c:03d}/img_{i:08d}.jpg" for i, c in enumerate(classes))
            lines = (f"{name},{name.split('/')[0]}\n" for name in names)
            csvs[rows].write_text("filename,label\n" + "".join(lines))
    trees = {rows: folder / f"tree_{rows}" for rows in (small, large)}
    for rows, tree in trees.items():
        if sum(1 for _ in tree.glob("*/*.jpg")) != rows:
            with open(csvs[rows]) as file:
                for row in list(csv.reader(file))[1:]:
                    (tree / row[0]).parent.mkdir(parents=True, exist_ok=True)
                    (tree / row[0]).touch()
    return csvs, trees


def seconds(call) -> tuple[float, float]:
    """Wall and CPU seconds of one call (CPU time: the work itself, less what others' use costs)."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the baked package, e.g. bench_proj")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("build/bench/index"))
    parser.add_argument("--rows", type=int, nargs=2, default=[100_000, 1_000_000])
    parser.add_argument("--against", help="another bake's package: its CSV reader timed too")
    args = parser.parse_args()
    index = importlib.import_module(f"{args.package}.data.index")
    labels = index  # the labels CSV reader too
    extensions = importlib.import_module(f"{args.package}.data.images").IMG_EXTENSIONS
    small, large = args.rows
    csvs, trees = write_inputs(args.dir, small, large)
    tree = trees[small]
    classes = index.find_classes(tree)
    class_to_idx = {name: i for i, name in enumerate(classes)}
    small_table = labels.read_labels_csv(csvs[small])

    against = args.against and importlib.import_module(f"{args.against}.data.index")
    if against and not hasattr(against, "read_labels_csv"):  # older bakes: data/labels_csv.py
        against = importlib.import_module(f"{args.against}.data.labels_csv")

    def encode(table, module=labels):
        if not hasattr(module, "classes_from_labels"):  # labels are class names
            return table.targets(sorted(table.values))
        if "reading" not in inspect.signature(module.classes_from_labels).parameters:
            return module.encode_labels(table, module.classes_from_labels(table))  # no label_kind
        values = set(table.values)  # "auto": indices only when the labels are exactly 0..K-1
        reading = "index" if values == {str(i) for i in range(len(values))} else "name"
        return module.encode_labels(table, module.classes_from_labels(table, reading), reading)

    steps = {}
    for rows, path in csvs.items():
        steps[f"labels CSV, {rows:,} rows: read + encode"] = (
            lambda path=path: encode(baseline_read_labels_csv(labels, path)),
            lambda path=path: encode(labels.read_labels_csv(path)),
        )
        if against:
            steps[f"  {args.against}'s reader, {rows:,} rows"] = (
                lambda path=path: encode(baseline_read_labels_csv(labels, path)),
                lambda path=path: encode(against.read_labels_csv(path), against),
            )
    for rows, folder_tree in trees.items():
        steps[f"class folders, {rows:,} files: make_dataset"] = (
            lambda t=folder_tree: baseline_make_dataset(t, class_to_idx, extensions),
            lambda t=folder_tree: index.make_dataset(t, class_to_idx),
        )
    steps[f"CSV of {small:,} rows against the tree: find_missing"] = (
        lambda: baseline_find_missing(small_table, tree, extensions),
        lambda: labels.find_missing(small_table, tree),
    )
    steps[f"  against a stat per row, {small:,} rows"] = (
        lambda: stat_per_row(small_table, tree),
        lambda: labels.find_missing(small_table, tree),
    )
    times: dict[str, tuple[list, list]] = {name: ([], []) for name in steps}
    for _ in range(args.rounds):
        for name, (old, new) in steps.items():
            times[name][0].append(seconds(old))
            times[name][1].append(seconds(new))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if os.name == "posix" else "?"
    print(f"{os.cpu_count()} CPUs, load {load}; median of {args.rounds} alternating rounds")
    print(
        f"{'step':48s} {'wall s: old':>11s} {'new':>6s} {'old/new':>7s}  {'CPU s: old':>10s}",
        end="",
    )
    print(f" {'new':>6s} {'old/new':>7s}")
    for name, (old, new) in times.items():
        print(f"{name:48s}", end="")
        for kind in (0, 1):  # wall, CPU
            old_s = statistics.median(t[kind] for t in old)
            new_s = statistics.median(t[kind] for t in new)
            print(f" {old_s:11.3f} {new_s:6.3f} {old_s / new_s:6.1f}x ", end="")
        print()

    table = labels.read_labels_csv(csvs[large])
    targets = encode(table)
    paths_bytes = int(sum(len(p) for p in table.paths.tolist()))
    print(
        f"index of {large:,} rows: paths {table.paths.dtype} {table.paths.nbytes:,} B "
        f"(as one buffer + int64 offsets: {paths_bytes + 8 * (len(table.paths) + 1):,} B), "
        f"targets {targets.nbytes:,} B, "
        f"table codes {table.codes.nbytes:,} B, lines {table.lines.nbytes:,} B"
    )
    readers = [
        ("old", lambda: baseline_read_labels_csv(labels, csvs[large])),
        ("new", lambda: labels.read_labels_csv(csvs[large])),
    ]
    if against:
        readers.append((args.against, lambda: against.read_labels_csv(csvs[large])))
    for name, read in readers:
        tracemalloc.start()
        read()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"peak heap while reading {large:,} rows, {name}: {peak / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
