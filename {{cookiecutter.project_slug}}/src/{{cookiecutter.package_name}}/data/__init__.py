"""The data side: image files on disk to normalised batches on the device.

datamodule: composes a source and the shared options; sources: class folders, labels CSV and
shards (source_base: the interface and what every source builds with); index: the numpy index
of class folders, unlabelled folders and the seeded split; labels_csv: a labels CSV read to numpy
arrays; dataset: the lazy Dataset; images: decoding; transforms: uint8 crops; cache:
pre-decoded pixels; cache_dirs: where caches live (never in a dataset), which ones may be removed,
and their file locks; scan: unreadable files; loaders: DataLoader
settings and samplers; normalize: uint8 to normalised float; cpus: worker arithmetic; once: work
done on rank zero and sent to the others; demo: the generated demo set; shards: LitData shards
streamed back (the `shard` command writes them).
"""


def __getattr__(name: str):
    # `from <package>.data import ImageDataModule` keeps working; imported on first use only, so
    # that reading an image (`data.images`) does not import Lightning.
    if name == "ImageDataModule":
        from {{ cookiecutter.package_name }}.data.datamodule import ImageDataModule

        return ImageDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
