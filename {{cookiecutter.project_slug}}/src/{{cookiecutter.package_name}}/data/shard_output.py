"""Where `shard` may write and what it may remove: only the files its manifest makes its own.

`shard` first writes `shard-manifest.json`, claiming the split folders (`train/`, ...) while
empty, and `dataset.json` last. The next run removes LitData's files in the folders claimed and
those two files, nothing else (`--overwrite` or not): a user's file where the shards go is in the
way; an output with files but no manifest is refused unless `--overwrite` (which writes beside).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
from pathlib import Path

from {{ cookiecutter.package_name }}.errors import DataError

MANIFEST = "shard-manifest.json"
META = "dataset.json"  # written last: the shards are complete
PAGE = 1000  # S3 deletes at most 1,000 keys per request (and lists as many)
OURS = ("chunk-*.bin", "*index.json")  # what LitData writes into an output folder


class ShardOutput:
    """A folder or an `s3://bucket/prefix`: its files (relative paths, with `/`) and manifest."""

    def __init__(self, url: str, option: str = "--output") -> None:
        self.url = str(url).rstrip("/")
        self.remote = "://" in self.url
        if self.remote:
            scheme, _, rest = self.url.partition("://")
            self.bucket, _, prefix = rest.partition("/")
            if scheme != "s3" or not self.bucket:
                raise DataError(
                    f"{option} {url}: shards go in a folder or s3://bucket/prefix "
                    "(S3 or an S3-compatible store through AWS_ENDPOINT_URL)"
                )
            self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        elif Path(self.url).exists() and not Path(self.url).is_dir():
            raise DataError(f"{option} {url} is a file: give a folder for the shards")

    @functools.cached_property
    def s3(self):
        import boto3  # LitData's dependency, configured by the AWS variables and files

        return boto3.client("s3")

    def files(self, folder: str = "", limit: int | None = None) -> list[str]:
        """The files under `folder` (all of the output by default), at most `limit` of them."""
        found: list[str] = []
        if self.remote:
            paginate = self.s3.get_paginator("list_objects_v2").paginate
            pages = paginate(Bucket=self.bucket, Prefix=self.prefix + (folder and f"{folder}/"))
            walk = ([i["Key"][len(self.prefix) :] for i in p.get("Contents", [])] for p in pages)
        else:
            walk = (  # a link to a folder counts as a file
                [Path(here, n).relative_to(self.url).as_posix() for n in names + links]
                for here, dirs, names in os.walk(Path(self.url, folder))
                for links in [[n for n in dirs if Path(here, n).is_symlink()]]
            )
        for names in walk:
            found += names
            if limit is not None and len(found) >= limit:
                break
        return found[:limit]

    def owned(self) -> set[str]:
        """LitData's files in the folders our manifest claimed (any other file there since is the
        user's), the manifest and `dataset.json`; nothing without our manifest."""
        manifest = self.read_json(MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("shard_manifest") != 1:
            return set()
        claimed = [name for folder in manifest["folders"] for name in self.files(folder)]
        ours = [n for n in claimed if any(fnmatch.fnmatchcase(n.split("/")[-1], p) for p in OURS)]
        return {*ours, META, MANIFEST, f".{META}.partial", f".{MANIFEST}.partial"}

    def claim(self, splits: list[str], overwrite: bool) -> set[str]:
        """The files of an earlier run to remove before writing `splits`; DataError where the
        output holds others' files and not `overwrite`, or others' files where the shards go."""
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
        in_the_way = [name for name in there if name not in owned]
        if in_the_way:
            more = f" (and {len(in_the_way) - 1} more)" if len(in_the_way) > 1 else ""
            raise DataError(
                f"--output {self.url} holds {self.url}/{in_the_way[0]}{more}, which shard did "
                "not write, where the shards go: move it away or choose another --output"
            )
        return owned

    def remove(self, names: set[str]) -> None:
        """Delete `names`, our `dataset.json` first (no reader then takes the rest as complete)."""
        ordered = [META] * (META in names) + sorted(names - {META, MANIFEST})
        if self.remote:
            keys = [{"Key": self.prefix + name} for name in ordered]
            for start in range(0, len(keys), PAGE):
                batch = {"Objects": keys[start : start + PAGE], "Quiet": True}
                errors = self.s3.delete_objects(Bucket=self.bucket, Delete=batch).get("Errors")
                if errors:
                    name, why = errors[0]["Key"][len(self.prefix) :], errors[0].get("Message")
                    raise DataError(f"cannot delete {self.url}/{name}: {why}")
            return
        for name in ordered:
            Path(self.url, name).unlink(missing_ok=True)
        for folder in {name.rpartition("/")[0] for name in ordered} - {""}:  # a split's
            with contextlib.suppress(OSError):
                Path(self.url, folder).rmdir()  # only where emptied: a user's file keeps it

    def start(self, splits: list[str]) -> None:
        """Write the manifest claiming the `splits` folders (`claim` found them empty)."""
        if not self.remote:
            Path(self.url).mkdir(parents=True, exist_ok=True)
        self.write_json(MANIFEST, {"shard_manifest": 1, "folders": splits})

    def read(self, name: str) -> bytes | None:
        if not self.remote:
            path = Path(self.url, name)
            return path.read_bytes() if path.is_file() else None
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def read_json(self, name: str) -> dict | None:  # None where missing or not JSON
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
