"""``shardfeed inspect | check | unpack | convert | stage | index | serve``: the dataset tools.

Plain click commands (:mod:`shardfeed.convert.cli` attaches every command in :data:`COMMANDS`),
each a thin layer over one function of :mod:`shardfeed.convert.tools` (one module per command);
these only parse options, draw progress bars and print. None of them imports torch.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import click

from .common import EXIT_ERROR, SizeParam, command, json_option, pack_options, quiet, write_json_report
from .progress import progress_bar
from .storage_options import storage_option, storage_options_of

__all__ = ["COMMANDS", "inspect_cmd", "check_cmd", "unpack_cmd", "convert_cmd", "stage_cmd", "index_cmd", "serve_cmd"]


def _out(json_path: str | None) -> bool:
    """Human output goes to stderr when the JSON report goes to stdout."""
    return json_path == "-"


def _is_remote_folder(source: str, storage_options: dict) -> bool:
    """A remote, listable location without a manifest that holds class folders (one listing;
    :func:`~shardfeed.readers.storage.location.folder_kind`)."""
    from shardfeed.readers.storage.opener import is_remote

    if not is_remote(source) or source.endswith(".json"):
        return False
    from shardfeed.readers.storage.location import folder_kind
    from shardfeed.readers.storage.opener import open_location

    loc = open_location(source, storage_options=storage_options)
    if not loc.listable:
        return False
    try:
        loc.read_bytes(loc.manifest_name)
        return False
    except FileNotFoundError:
        return folder_kind(loc) == "folder"


def _print_problems(problems: list, err: bool, limit: int = 30) -> None:
    for p in problems[:limit]:
        where = p["shard"] or "dataset"
        if p.get("key"):
            where += f" key {p['key']}"
        problem = p["problem"]
        # most messages already start with the file's path: do not name the shard twice
        first = problem.split(": ", 1)[0]
        names_key = bool(p.get("key")) and first.endswith(f" key {p['key']}")  # "PATH key KEY: ..." names both
        if names_key or (p["shard"] and not p.get("key")
                         and os.path.basename(first).split(".")[0] == p["shard"].split(".")[0]):
            click.echo(f"  {problem}", err=err)
        else:
            click.echo(f"  {where}: {problem}", err=err)
    if len(problems) > limit:
        click.echo(f"  ... and {len(problems) - limit} more (see --json)", err=err)


@command("inspect", reads=("source",), short_help="Describe a dataset: format, classes with counts, shards.")
@storage_option
@click.argument("source", metavar="PATH_OR_URL")
@click.option("--class-counts/--no-class-counts", default=None,
              help="Count samples per class by reading every label from the data [default: on for local "
                   "datasets, off for URLs, where it downloads every shard].")
@click.option("--examples", type=click.IntRange(min=0), default=3, show_default=True,
              help="Sample keys to show with their metadata.")
@click.option("--max-shards", type=click.IntRange(min=2), default=10, show_default=True,
              help="Shards listed one by one before the list is summarised (--json lists all).")
@json_option
@click.pass_context
def inspect_cmd(ctx, source: str, class_counts, examples: int, max_shards: int, json_path) -> None:
    """Describe a dataset: format, version, creator, samples, classes with counts, shards, skipped files.

    PATH_OR_URL is a packed directory, its manifest.json, an http(s):// URL of either, or an
    image folder (ImageFolder layout: class counts come from its files).

    \b
    Class counts of a packed dataset come from the data (every .cls member or LMDB record
    is read; the manifest has the class map, not per-class counts); the report says so.
    Exit status 1 when the report lists problems (missing files, a damaged offset index).

    \b
    Examples:
      shardfeed inspect out/train
      shardfeed inspect http://127.0.0.1:8000/ --json -
    """
    from shardfeed.convert.tools.common import is_url, looks_like_image_folder
    from shardfeed.convert.tools.inspect import (
        format_folder_report,
        format_inspect_report,
        inspect_dataset,
        inspect_image_folder,
    )

    err = _out(json_path)
    storage_options = storage_options_of(ctx)
    remote_folder = _is_remote_folder(source, storage_options)
    if remote_folder or not is_url(source):
        if remote_folder or looks_like_image_folder(source):
            report = inspect_image_folder(source, examples, storage_options=storage_options)
            click.echo(format_folder_report(report), err=err)
            write_json_report(json_path, report)
            return
    bar, update = progress_bar(0, 0, "count classes", quiet() or class_counts is False
                               or (class_counts is None and is_url(source)))
    try:
        report = inspect_dataset(source, count_classes_from_data=class_counts, num_examples=examples,
                                 max_shards_listed=max_shards, progress=update, storage_options=storage_options)
    finally:
        bar.close()
    click.echo(format_inspect_report(report), err=err)
    write_json_report(json_path, report)
    if report.get("problems"):
        sys.exit(EXIT_ERROR)  # the report is out; the status says the dataset is not readable as it is


@command("check", reads=("source",), short_help="Verify sha256, sizes and samples against the manifest.")
@storage_option
@click.argument("source", metavar="PATH")
@click.option("--decode", is_flag=True, help="Also decode every image (catches damage the sha256 cannot place, "
                                             "and images that never decoded).")
@click.option("--max-decode-bytes", type=SizeParam(), default="512MiB", show_default=True, metavar="SIZE",
              help="With --decode: an image whose decode would take more memory than this (read from its header, "
                   "before decoding) is reported as a problem (decompression bombs).")
@json_option
@click.pass_context
def check_cmd(ctx, source: str, decode: bool, max_decode_bytes: int, json_path) -> None:
    """Prove a packed dataset is intact: recompute every shard's sha256, size and sample count.

    \b
    WebDataset: each shard's sha256, size and sample count against the manifest, its offset
    index, and every sample's members (image, .cls in range, readable .json), keys unique.
    LMDB: every record's CRC-32, keys and labels, the record count, and the manifest stored in
    the database against manifest.json.
    Prints what is wrong by shard and key; the exit status is 1 when anything is.

    \b
    Examples:
      shardfeed check out/train
      shardfeed check out/train --decode --json check.json
    """
    from shardfeed.convert.tools.check import check_dataset
    from shardfeed.convert.tools.common import DatasetLocation

    storage_options = storage_options_of(ctx)
    manifest = DatasetLocation(source, storage_options=storage_options).load_manifest(check_files=False)
    bar, update = progress_bar(manifest.num_samples, sum(s.num_bytes for s in manifest.shards),
                               "check" + (" + decode" if decode else ""), quiet())
    try:
        report = check_dataset(source, decode=decode, progress=update, max_decode_bytes=max_decode_bytes,
                               storage_options=storage_options)
    finally:
        bar.close()
    err = _out(json_path)
    click.echo(report.summary(), err=err)
    _print_problems(report.problems, err)
    write_json_report(json_path, report.to_json())
    if not report.ok:
        sys.exit(EXIT_ERROR)


@command("unpack", reads=("source",), writes=("out",),
         short_help="Write a packed dataset back as an image folder, byte-identical.")
@storage_option
@click.argument("source", metavar="PATH")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--overwrite", is_flag=True, help="Write into a non-empty OUT, replacing files of the same names.")
@json_option
@click.pass_context
def unpack_cmd(ctx, source: str, out: Path, overwrite: bool, json_path) -> None:
    """Write a packed dataset back as an image folder: OUT/CLASS/..., byte-identical files.

    Each image goes to its original relative path (stored in its metadata); one without a
    stored path goes to CLASS/KEY.EXT. Every class gets its folder (empty ones too), so
    ImageFolder(OUT) finds the same class indices. Stored paths that are absolute or hold '..'
    are refused. Files skipped at pack time are not in the dataset and are not written.

    \b
    Example:
      shardfeed unpack out/train restored/train
    """
    from shardfeed.convert.tools.common import DatasetLocation
    from shardfeed.convert.tools.unpack import unpack

    storage_options = storage_options_of(ctx)
    manifest = DatasetLocation(source, storage_options=storage_options).load_manifest(check_files=False)
    bar, update = progress_bar(manifest.num_samples, sum(s.num_bytes for s in manifest.shards), "unpack", quiet())
    try:
        report = unpack(source, out, overwrite=overwrite, progress=update, storage_options=storage_options)
    finally:
        bar.close()
    click.echo(report.summary(), err=_out(json_path))
    write_json_report(json_path, report.to_json())


@command("convert", reads=("src",), writes=("out",),
         short_help="Convert between wds and lmdb, or re-shard; bytes unchanged.")
@storage_option
@click.argument("src", metavar="SRC")
@click.argument("out", metavar="OUT")
@pack_options("format", "max_count", "max_bytes", "prefix", "workers", "overwrite",
              format={"required": True, "default": None, "show_default": False},
              prefix={"help": "WebDataset: shard file prefix."},
              workers={"help": "Image-folder SRC only: processes that pack [default: CPU count]."},
              overwrite={"help": "Replace a dataset in OUT (only files shardfeed writes)."})
@json_option
@click.pass_context
def convert_cmd(ctx, src: str, out: str, fmt: str, max_count: int, max_bytes: int, prefix: str, workers,
                overwrite: bool, json_path) -> None:
    """Convert SRC to another format or re-shard it, without decoding or re-encoding.

    SRC is a packed dataset (directory, manifest, or URL of a WebDataset) or an image folder
    (then this is `shardfeed pack` with its default seed and shuffle). Keys, labels, metadata,
    image bytes, sample order and the class map are kept; the new manifest records where the
    data came from. OUT is a local folder or s3://BUCKET/PREFIX (WebDataset: built in a local
    staging folder, uploaded shard by shard, the manifest last, as `shardfeed pack` does).

    \b
    Examples:
      shardfeed convert out/train-wds out/train-lmdb --format lmdb
      shardfeed convert out/train-wds out/train-big --format wds --max-bytes 1GB   # re-shard
      shardfeed convert out/train-lmdb s3://bucket/train --format wds
    """
    from shardfeed.convert.tools.common import DatasetLocation, is_url, looks_like_image_folder
    from shardfeed.convert.tools.convert import convert_dataset

    total, total_bytes = 0, 0
    if is_url(src) or not looks_like_image_folder(src):
        manifest = DatasetLocation(src, storage_options=storage_options_of(ctx)).load_manifest(check_files=False)
        total, total_bytes = manifest.num_samples, sum(s.num_bytes for s in manifest.shards)
    bar, update = progress_bar(total, total_bytes, f"convert -> {fmt.lower()}", quiet())
    try:
        report = convert_dataset(src, out, format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix,
                                 workers=workers, overwrite=overwrite, progress=update,
                                 storage_options=storage_options_of(ctx))
    finally:
        bar.close()
    click.echo(report.summary(), err=_out(json_path))
    write_json_report(json_path, report.to_json())


@command("stage", reads=("src",), writes=("dest",),
         short_help="Copy a dataset to fast local storage: verified, resumable.")
@storage_option
@click.argument("src", metavar="SRC")
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--min-free", "min_free_bytes", type=SizeParam(), default=None, metavar="SIZE",
              help="Space to leave free on DEST's file system [default: 1 GB + 2% of it; on a memory file "
                   "system such as /dev/shm 1 GB + 10%, and RAM available is counted too].")
@click.option("--retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="HTTP: retries per request after the first attempt (a broken transfer resumes where it stopped).")
@click.option("--overwrite", is_flag=True,
              help="Replace a different dataset already staged in DEST [default: refuse; the same dataset is "
                   "refreshed or resumed without it].")
@json_option
@click.pass_context
def stage_cmd(ctx, src: str, dest: Path, min_free_bytes, retries: int, overwrite: bool, json_path) -> None:
    """Copy a packed dataset (local path or http(s):// URL) to fast local storage before training.

    \b
    Checks free space first (with headroom; refuses to fill /dev/shm), copies shard by shard
    with sha256 verification under temporary names renamed when verified, continues partial
    copies and skips files already staged and intact (rerun it after an interruption), and
    writes manifest.json last. It never replaces a file in DEST that no dataset's manifest there
    names (yours, a link): it stops and names it. Prints the path to give the reader; exit
    status 1 on any mismatch.

    \b
    Examples:
      shardfeed stage /nfs/datasets/train /local/nvme/train
      shardfeed stage http://data-host:8000/train/ /dev/shm/train --json stage.json
    """
    from shardfeed.convert.tools.common import DatasetLocation
    from shardfeed.convert.tools.stage import stage

    storage_options = storage_options_of(ctx)
    manifest = DatasetLocation(src, storage_options=storage_options).load_manifest(check_files=False)
    total_bytes = sum(s.num_bytes for s in manifest.shards)
    bar, update = progress_bar(len(manifest.shards), total_bytes, "stage", quiet())
    bar.unit = "file"
    try:
        report = stage(src, dest, min_free_bytes=min_free_bytes, progress=update, retries=retries,
                       overwrite=overwrite, storage_options=storage_options)
    finally:
        bar.close()
    err = _out(json_path)
    click.echo(report.summary(), err=True)
    _print_problems(report.problems, True)
    write_json_report(json_path, report.to_json())
    if not report.ok:
        sys.exit(EXIT_ERROR)
    if not err:
        click.echo(report.path)


@command("index", reads=("pattern", "classes_file"),
         short_help="Write manifest + .sfidx files for shards made by other tools.")
@storage_option
@click.argument("pattern", metavar="DIR_OR_URL_PATTERN")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder for manifest.json and the .sfidx files [default: beside the shards; required for URLs, "
                   "then upload them beside the shards; for local shards only their own folder: a manifest names "
                   "its shards by plain file name].")
@click.option("--classes", "classes_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Text file with one class name per line (line i names class index i).")
@click.option("--overwrite", is_flag=True, help="Replace an existing manifest.json.")
@click.option("--no-labels", is_flag=True, help="Unlabelled shards (img2dataset's jpg + txt + json, no .cls): a "
              "sample needs one image; its other members (txt, ...) become extra fields; readers give label -1.")
@json_option
@click.pass_context
def index_cmd(ctx, pattern: str, out, classes_file, overwrite: bool, no_labels: bool, json_path) -> None:
    """Make WebDataset shards written by other tools readable by shardfeed, without rewriting them.

    DIR_OR_URL_PATTERN is a folder (its *.tar), a path with globs or braces
    (shards/train-{000000..000099}.tar), or an http(s):// URL with braces. Each shard is read
    once; the manifest (format webdataset, sha256 per shard) and an offset index per shard are
    written. Labels come from .cls members; class names from --classes, else from the samples'
    .json "class" field, else "0", "1", ... Members that do not form a sample (no image, no
    class, ...) are reported by shard and key and left out.

    \b
    Examples:
      shardfeed index /data/wds-shards
      shardfeed index 'http://host/shards/train-{000000..000146}.tar' --out manifests/ --classes classes.txt
      shardfeed index /data/laion-part --no-labels           # img2dataset output: jpg + txt + json
    """
    from shardfeed.convert.tools.index import index_shards

    bar, update = progress_bar(0, 0, "index", quiet())
    try:
        report = index_shards(pattern, out=out, classes_file=classes_file, overwrite=overwrite, progress=update,
                              storage_options=storage_options_of(ctx), labels=not no_labels)
    finally:
        bar.close()
    err = _out(json_path)
    click.echo(report.summary(), err=err)
    if report.problems:
        click.echo("members that do not form a sample (left out):", err=True)
        _print_problems(report.problems, True)
    write_json_report(json_path, report.to_json())


@command("serve", short_help="Serve a packed directory over HTTP, with Range requests.")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; 0.0.0.0 exposes every file below PATH to the network, without authentication.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--max-connections", type=click.IntRange(min=1), default=128, show_default=True,
              help="Connections handled at once (one thread each); more wait in the listen queue.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True,
              help="Seconds a request's headers may take to arrive (and a keep-alive connection may idle) before "
                   "the connection is closed.")
def serve_cmd(path: Path, host: str, port: int, max_connections: int, timeout_s: float) -> None:
    """Serve a packed directory over HTTP (threaded, with Range requests) until Ctrl-C.

    Readers on other machines then open it with open_dataset("http://HOST:PORT/").
    Only regular files inside PATH are served, never through a symbolic link, and nothing
    hidden (no path component starting with "."): listings leave those out too.
    This is for tests and quick sharing: for production, serve the files with a real web
    server (nginx answers Range requests out of the box) or an object store; docs/packing.md
    ("Dataset tools", serve) has an nginx location block.

    \b
    Example:
      shardfeed serve out/train --port 8000
    """
    from shardfeed.convert.tools.serve import make_server, server_url

    try:
        server = make_server(path, host, port, max_connections=max_connections, timeout_s=timeout_s)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"{host}:{port} is already in use: choose another --port "
                                     "(--port 0 picks a free one)") from None
        raise
    url = server_url(server)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving {path} to the network on {host}, without authentication", err=True)
    click.echo(f"serving {path.resolve()} at {url} (Ctrl-C to stop)", err=True)
    click.echo(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
    finally:
        server.server_close()


#: The commands :mod:`shardfeed.convert.cli` attaches to the ``shardfeed`` group.
COMMANDS = [inspect_cmd, check_cmd, unpack_cmd, convert_cmd, stage_cmd, index_cmd, serve_cmd]
