"""Where `shard` may write and what it may remove: never among the images it reads, and only the
files its manifest lists.

`shard` writes `shard-manifest.json` first, claiming the split folders (`train/`, `val/`, ...),
each empty when claimed; once LitData has written them, the manifest lists every file they hold,
and only then is `dataset.json` written. Whatever a run leaves, finished or killed, the next one
knows as its own: the files listed, or for a run that never finished, LitData's files inside the
folders it claimed. Nothing else is removed, `--overwrite` or not; a non-empty output without our
manifest is refused unless `--overwrite` (which then writes beside what is there).

`s3://bucket/prefix` goes through LitData's boto3 client, a page of 1,000 keys per list or delete
request (S3's limit).
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


def _litdata_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in LITDATA_NAMES)


class ShardOutput:
    """A folder or an `s3://bucket/prefix` as `shard` sees it: its files (paths relative to it,
    with `/`), and the manifest of those `shard` wrote."""

    def __init__(self, url: str) -> None:
        self.url = str(url).rstrip("/")
        self.remote = "://" in self.url
        if self.remote:
            scheme, _, rest = self.url.partition("://")
            if scheme != "s3" or not rest.split("/", 1)[0]:
                raise DataError(
                    f"--output {url}: shard writes to a folder or to s3://bucket/prefix "
                    "(S3 or an S3-compatible store through AWS_ENDPOINT_URL)"
                )
            self.bucket, _, prefix = rest.partition("/")
            self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        elif Path(self.url).exists() and not Path(self.url).is_dir():
            raise DataError(f"--output {url} is a file: give a folder for the shards")

    @functools.cached_property
    def _s3(self):
        """boto3's S3 client, as LitData configures it (the AWS variables and files)."""
        from litdata.streaming.fs_provider import _get_fs_provider

        return _get_fs_provider(self.url).client.client

    def files(self, folder: str = "", limit: int | None = None) -> list[str]:
        """The files under `folder` (all of the output by default), at most `limit` of them."""
        found: list[str] = []
        if self.remote:
            paginator = self._s3.get_paginator("list_objects_v2")
            start = self.prefix + (f"{folder}/" if folder else "")
            pages = paginator.paginate(
                Bucket=self.bucket, Prefix=start, PaginationConfig={"PageSize": PAGE}
            )
            for page in pages:  # ListObjectsV2's continuation token, page after page
                found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
                if limit is not None and len(found) >= limit:
                    break
            return found[:limit]
        top = Path(self.url, folder)
        if not top.is_dir():
            return []
        for here, folders, names in os.walk(top):
            links = [name for name in folders if Path(here, name).is_symlink()]  # not walked
            for name in names + links:
                found.append(Path(here, name).relative_to(self.url).as_posix())
                if limit is not None and len(found) >= limit:
                    return found
        return found

    def manifest(self) -> dict | None:
        """The manifest of an earlier `shard` here; None where there is none of ours."""
        manifest = self.read_json(MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("shard_manifest") != FORMAT:
            return None
        return manifest

    def owned(self, manifest: dict | None) -> set[str]:
        """What `manifest` makes ours: the files it lists, or, for a run that never finished,
        the files inside the folders it claimed (empty when it claimed them) that LitData names
        as it writes them: a file put there since is the user's."""
        if manifest is None:
            return set()
        ours = {META, MANIFEST, f".{META}.partial", f".{MANIFEST}.partial"}
        if manifest.get("files") is not None:
            return {*manifest["files"], *ours}
        claimed = (name for folder in manifest.get("folders") or [] for name in self.files(folder))
        return {*(name for name in claimed if _litdata_name(name.rpartition("/")[2])), *ours}

    def claim(self, splits: list[str], overwrite: bool) -> set[str]:
        """Check that `shard` may write `splits` here and return the files of an earlier run that
        it is to remove first.

        Raises:
            DataError: the output holds files that no manifest of ours lists, and `overwrite` is
                off; or such files sit where the new shards go (`overwrite` or not).
        """
        manifest = self.manifest()
        owned = self.owned(manifest)
        if manifest is None and self.files(limit=1) and not overwrite:
            raise DataError(
                f"--output {self.url} holds files that shard did not write: choose an empty or "
                "new --output, or pass --overwrite true to write the shards beside them (nothing "
                "there is removed)"
            )
        there = [name for split in splits for name in self.files(split)]
        there += [name for name in (META, MANIFEST) if self._exists(name)]
        if not self.remote:  # a file where a split's folder goes
            there += [split for split in splits if Path(self.url, split).is_file()]
        self._refuse([name for name in there if name not in owned])
        return owned

    def _refuse(self, in_the_way: list[str]) -> None:
        if in_the_way:
            more = f" (and {len(in_the_way) - 1} more)" if len(in_the_way) > 1 else ""
            raise DataError(
                f"--output {self.url} holds {self._join(in_the_way[0])}{more}, which shard did "
                "not write, where the shards go: move it away or choose another --output"
            )

    def remove(self, names: set[str]) -> None:
        """Delete `names` (our `dataset.json` first, so that no reader takes the rest for
        complete shards); never anything else."""
        first = [META] if META in names else []
        ordered = first + sorted(name for name in names if name not in (META, MANIFEST))
        if not ordered:
            return
        if self.remote:
            client = self._s3
            keys = [self.prefix + name for name in ordered]
            for start in range(0, len(keys), PAGE):
                batch = {"Objects": [{"Key": key} for key in keys[start : start + PAGE]]}
                done = client.delete_objects(Bucket=self.bucket, Delete={**batch, "Quiet": True})
                if done.get("Errors"):
                    error = done["Errors"][0]
                    raise DataError(
                        f"cannot delete {self._join(error['Key'][len(self.prefix) :])}: "
                        f"{error.get('Message', error.get('Code'))}"
                    )
            return
        for name in ordered:
            Path(self.url, name).unlink(missing_ok=True)
        folders = {Path(self.url, name).parent for name in ordered}
        for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
            while folder != Path(self.url) and Path(self.url) in folder.parents:
                try:
                    folder.rmdir()  # only where emptied: a user's file keeps its folder
                except OSError:
                    break
                folder = folder.parent

    def start(self, splits: list[str]) -> None:
        """Write the manifest that claims the `splits` folders, before any shard.

        Raises:
            DataError: a folder is not empty (a file put there while this ran): LitData would
                refuse it, or empty it.
        """
        self._refuse([name for split in splits for name in self.files(split, limit=1)])
        if not self.remote:
            Path(self.url).mkdir(parents=True, exist_ok=True)
        self.write_json(MANIFEST, {"shard_manifest": FORMAT, "folders": splits, "files": None})

    def finish(self, splits: list[str]) -> None:
        """List in the manifest every file the `splits` folders now hold (and `dataset.json`,
        written next)."""
        files = sorted({name for split in splits for name in self.files(split)} | {META})
        self.write_json(MANIFEST, {"shard_manifest": FORMAT, "folders": splits, "files": files})

    def _join(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _exists(self, name: str) -> bool:
        if not self.remote:
            return Path(self.url, name).exists()
        key = self.prefix + name
        found = self._s3.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        return any(item["Key"] == key for item in found.get("Contents", []))

    def read_json(self, name: str) -> dict | None:
        """The JSON file `name` of the output; None where it is missing or not JSON."""
        if not self.remote:
            path = Path(self.url, name)
            text = path.read_text(encoding="utf-8") if path.is_file() else None
        else:
            client = self._s3
            try:
                body = client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"]
                text = body.read().decode("utf-8")
            except client.exceptions.NoSuchKey:
                text = None
        try:
            return json.loads(text) if text is not None else None
        except json.JSONDecodeError:
            return None

    def write_json(self, name: str, content: dict) -> None:
        """Write `name`, whole or not at all (a local file is renamed into place)."""
        text = json.dumps(content, indent=1)
        if self.remote:
            self._s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=text)
            return
        staged = Path(self.url, f".{name}.partial")
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, Path(self.url, name))
