"""Where `shard` may write and what it may remove: only the files its manifest makes its own.

`shard` writes `shard-manifest.json` first, claiming the split folders (`train/`, `val/`, ...),
each empty when claimed; `dataset.json` comes last. Whatever a run leaves, finished or killed, the
next one knows as its own: the files LitData names (`chunk-*.bin`, `index.json`) inside the
folders claimed, and those two files. Nothing else is removed, `--overwrite` or not: a file put
in a claimed folder is in the way; a non-empty output without our manifest is refused unless
`--overwrite` (which then writes beside what is there). LitData has no such guard: `optimize`
refuses a non-empty output, or empties it with `mode="overwrite"`.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
from pathlib import Path

from {{ cookiecutter.package_name }}.errors import DataError

MANIFEST = "shard-manifest.json"
META = "dataset.json"  # data/shards.py reads it; defined twice so that this module needs no LitData
FORMAT = 1
PAGE = 1000  # S3 lists and deletes at most 1,000 keys per request
LITDATA_NAMES = ("chunk-*.bin", "*index.json")  # what LitData writes into an output folder


class ShardOutput:
    """A folder or an `s3://bucket/prefix` as `shard` sees it: its files (paths relative to it,
    with `/`), and the manifest of those `shard` wrote."""

    def __init__(self, url: str) -> None:
        self.url = str(url).rstrip("/")
        self.remote = "://" in self.url
        if self.remote:
            scheme, _, rest = self.url.partition("://")
            self.bucket, _, prefix = rest.partition("/")
            if scheme != "s3" or not self.bucket:
                raise DataError(
                    f"--output {url}: shard writes to a folder or to s3://bucket/prefix "
                    "(S3 or an S3-compatible store through AWS_ENDPOINT_URL)"
                )
            self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        elif Path(self.url).exists() and not Path(self.url).is_dir():
            raise DataError(f"--output {url} is a file: give a folder for the shards")

    @functools.cached_property
    def s3(self):
        """boto3's S3 client (LitData's dependency), configured by the AWS variables and files."""
        import boto3

        return boto3.client("s3")

    def files(self, folder: str = "", limit: int | None = None) -> list[str]:
        """The files under `folder` (all of the output by default), at most `limit` of them."""
        found: list[str] = []
        if self.remote:
            start = self.prefix + (f"{folder}/" if folder else "")
            pages = self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start, PaginationConfig={"PageSize": PAGE}
            )
            for page in pages:
                found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
                if limit is not None and len(found) >= limit:
                    break
            return found[:limit]
        for here, folders, names in os.walk(Path(self.url, folder)):
            links = [name for name in folders if Path(here, name).is_symlink()]  # not walked
            found += [Path(here, name).relative_to(self.url).as_posix() for name in names + links]
            if limit is not None and len(found) >= limit:
                break
        return found[:limit]

    def owned(self) -> set[str]:
        """What our manifest here makes ours: LitData's files in the folders it claimed (empty
        then: any other file there since is the user's), the manifest and `dataset.json`."""
        manifest = self.read_json(MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("shard_manifest") != FORMAT:
            return set()
        claimed = [name for folder in manifest["folders"] for name in self.files(folder)]
        litdata = [
            name
            for name in claimed
            if any(fnmatch.fnmatchcase(name.rpartition("/")[2], p) for p in LITDATA_NAMES)
        ]
        return {*litdata, META, MANIFEST, f".{META}.partial", f".{MANIFEST}.partial"}

    def claim(self, splits: list[str], overwrite: bool) -> set[str]:
        """Check that `shard` may write `splits` here and return the files of an earlier run that
        it is to remove first.

        Raises:
            DataError: the output holds files that no manifest of ours lists, and `overwrite` is
                off; or such files sit where the new shards go (`overwrite` or not).
        """
        owned = self.owned()
        if not owned and self.files(limit=1) and not overwrite:
            raise DataError(
                f"--output {self.url} holds files that shard did not write: choose an empty or "
                "new --output, or pass --overwrite true to write the shards beside them (nothing "
                "there is removed)"
            )
        there = [name for split in splits for name in self.files(split)]
        there += [name for name in (META, MANIFEST) if self.read(name) is not None]
        if not self.remote:  # a file where a split's folder goes
            there += [split for split in splits if Path(self.url, split).is_file()]
        self._refuse([name for name in there if name not in owned])
        return owned

    def _refuse(self, in_the_way: list[str]) -> None:
        if in_the_way:
            more = f" (and {len(in_the_way) - 1} more)" if len(in_the_way) > 1 else ""
            raise DataError(
                f"--output {self.url} holds {self.url}/{in_the_way[0]}{more}, which shard did "
                "not write, where the shards go: move it away or choose another --output"
            )

    def remove(self, names: set[str]) -> None:
        """Delete `names` (our `dataset.json` first, so that no reader takes the rest for
        complete shards); never anything else."""
        first = [META] if META in names else []
        ordered = first + sorted(name for name in names if name not in (META, MANIFEST))
        if self.remote:
            keys = [{"Key": self.prefix + name} for name in ordered]
            for start in range(0, len(keys), PAGE):
                batch = {"Objects": keys[start : start + PAGE], "Quiet": True}
                error = (
                    self.s3.delete_objects(Bucket=self.bucket, Delete=batch).get("Errors") or [None]
                )[0]
                if error:
                    raise DataError(
                        f"cannot delete {self.url}/{error['Key'][len(self.prefix) :]}: "
                        f"{error.get('Message', error.get('Code'))}"
                    )
            return
        for name in ordered:
            Path(self.url, name).unlink(missing_ok=True)
        for folder in sorted({Path(self.url, name).parent for name in ordered}, reverse=True):
            while folder != Path(self.url) and Path(self.url) in folder.parents:
                try:
                    folder.rmdir()  # only where emptied: a user's file keeps its folder
                except OSError:
                    break
                folder = folder.parent

    def start(self, splits: list[str]) -> None:
        """Write the manifest that claims the `splits` folders, before any shard; refused where
        a folder is not empty (a file put there while this ran): LitData would refuse or empty it.
        """
        self._refuse([name for split in splits for name in self.files(split, limit=1)])
        if not self.remote:
            Path(self.url).mkdir(parents=True, exist_ok=True)
        self.write_json(MANIFEST, {"shard_manifest": FORMAT, "folders": splits})

    def read(self, name: str) -> bytes | None:
        """The file `name` of the output; None where there is none."""
        if not self.remote:
            path = Path(self.url, name)
            return path.read_bytes() if path.is_file() else None
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def read_json(self, name: str) -> dict | None:
        """The JSON file `name` of the output; None where it is missing or not JSON."""
        try:
            return json.loads(self.read(name) or "null")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    def write_json(self, name: str, content: dict) -> None:
        """Write `name`, whole or not at all (a local file is renamed into place)."""
        text = json.dumps(content, indent=1)
        if self.remote:
            self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=text)
            return
        staged = Path(self.url, f".{name}.partial")
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, Path(self.url, name))
