"""Where `shard` writes, a folder or `s3://bucket/prefix`, and what it may remove: it first writes
`shard-manifest.json`, claiming the split folders (`train/`, ...), and `dataset.json` last. The
next run replaces LitData's files in the folders claimed and those two; it refuses any other."""

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
PAGE = 1000  # S3 deletes at most 1,000 keys per request
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

    def files(self, folder: str = "") -> list[str]:
        if not self.remote:  # a link to a folder counts as a file
            walk = os.walk(Path(self.url, folder))
            return [
                Path(here, n).relative_to(self.url).as_posix()
                for here, dirs, names in walk
                for n in names + [d for d in dirs if Path(here, d).is_symlink()]
            ]
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + (folder and f"{folder}/")
        )
        return [i["Key"][len(self.prefix) :] for page in pages for i in page.get("Contents", [])]

    def claim(self) -> set[str]:
        """The files an earlier `shard` wrote here (to replace); DataError if any other is here:
        the manifest's folders hold only LitData's files of ours (a file put there since is not)."""
        manifest = self.read_json(MANIFEST) or {}
        folders = manifest["folders"] if manifest.get("shard_manifest") == 1 else []
        claimed = [name for folder in folders for name in self.files(folder)]
        ours = [n for n in claimed if any(fnmatch.fnmatchcase(n.split("/")[-1], p) for p in OURS)]
        owned = {*ours, META, MANIFEST, f".{META}.partial", f".{MANIFEST}.partial"}
        owned = owned if folders else set()
        if others := [name for name in self.files() if name not in owned]:
            more = f" (and {len(others) - 1} more)" * (len(others) > 1)
            raise DataError(
                f"--output {self.url} holds {self.url}/{others[0]}{more}, which shard did not "
                "write: move it away or choose an empty or new --output"
            )
        return owned

    def remove(self, names: set[str]) -> None:
        """Delete `names`, our `dataset.json` first (no reader then takes the rest as complete)."""
        ordered = [META] * (META in names) + sorted(names - {META, MANIFEST})
        if self.remote:
            keys = [{"Key": self.prefix + name} for name in ordered]
            for start in range(0, len(keys), PAGE):
                batch = {"Objects": keys[start : start + PAGE], "Quiet": True}
                if errors := self.s3.delete_objects(Bucket=self.bucket, Delete=batch).get("Errors"):
                    raise DataError(f"cannot delete {errors[0]['Key']}: {errors[0].get('Message')}")
            return
        for name in ordered:
            Path(self.url, name).unlink(missing_ok=True)
        for folder in {name.rpartition("/")[0] for name in ordered} - {""}:  # a split's
            with contextlib.suppress(OSError):
                Path(self.url, folder).rmdir()

    def read_json(self, name: str) -> dict | None:
        """`name`'s JSON object; None where missing or not one."""
        missing = self.s3.exceptions.NoSuchKey if self.remote else OSError
        try:
            if self.remote:
                data = self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
            else:
                data = Path(self.url, name).read_bytes()
            value = json.loads(data)
        except (missing, OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_json(self, name: str, content: dict) -> None:
        """Write `name`, whole or not at all (a local file is renamed into place)."""
        text = json.dumps(content, indent=1)
        if self.remote:
            self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=text)
            return
        Path(self.url).mkdir(parents=True, exist_ok=True)
        staged = Path(self.url, f".{name}.partial")
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, Path(self.url, name))
