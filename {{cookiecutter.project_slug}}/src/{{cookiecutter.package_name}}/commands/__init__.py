"""The commands of `python -m {{ cookiecutter.package_name }} <command>`, each a thin `main()`."""

# name -> (module under commands/, one line for `--help`)
COMMANDS = {
    "fit": ("cli", "train a model (resume with --ckpt_path last)"),
    "validate": ("cli", "score a checkpoint on the validation images"),
    "test": ("cli", "score a checkpoint on held-out test images"),
    "predict": ("cli", "write the predicted class of every image of a folder to CSV"),
    "export": ("export", "write a checkpoint as one file to serve: .pt2 or ONNX"),
    "infer": ("infer", "classify images with an exported model, without Lightning"),
{%- if cookiecutter.serve == "yes" %}
    "serve": ("serve", "serve an exported model over HTTP (LitServe): POST images, get classes"),
{%- endif %}
    "scan": ("scan", "list the images of a dataset that cannot be read"),
{%- if cookiecutter.shards == "yes" %}
    "shard": ("shard", "write a dataset as LitData shards (folder, s3://) for Shards"),
{%- endif %}
    "bench": ("bench", "time the data loader against a naive baseline, per num_workers"),
    "report": ("report", "write a run's HTML report: curves, confusion matrix, mistakes"),
}

# The source's options also spelt flat, `--data.root DIR` for `--data.source.root DIR`: rewritten
# before parsing, as jsonargparse has no aliases for a subclass's arguments.
SOURCE_OPTIONS = {
    "root", "val_root", "val_csv", "val_fraction", "test_root", "test_csv",
    "epoch_images", "skip_bad_images", "cache",
    "filename_column", "label_column",
}  # fmt: skip
# flat name -> (the source it chooses, or None; its name under --data.source)
SOURCE_CHOOSING = {
    "labels_csv": ("LabelsCsv", "csv"),
{%- if cookiecutter.shards == "yes" %}
    "stream": ("Shards", "path"),
    "stream_cache_limit": (None, "cache_limit"),
{%- endif %}
}


def short_spellings(argv: list[str]) -> list[str]:
    """`argv` with each flat source option (`--data.root DIR`, also with `=`) spelt in full; one
    that names a kind of source (`labels_csv`) puts `--data.source KIND` before the first source
    option, as jsonargparse needs."""
    out, chosen, first = [], None, None
    for arg in argv:
        option, equals, value = arg.partition("=")
        name = option.removeprefix("--data.")
        if option.startswith("--data.") and (name in SOURCE_OPTIONS or name in SOURCE_CHOOSING):
            kind, name = SOURCE_CHOOSING.get(name, (None, name))
            chosen = chosen or kind
            arg = f"--data.source.{name}{equals}{value}"
        if first is None and arg.startswith("--data.source."):
            first = len(out)
        out.append(arg)
    return out if chosen is None else [*out[:first], "--data.source", chosen, *out[first:]]
