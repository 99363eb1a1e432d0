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
