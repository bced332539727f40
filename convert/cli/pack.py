"""``shardfeed pack``: an image folder into WebDataset shards or one LMDB (over :func:`shardfeed.convert.pack.pack`).

Never imports torch or webdataset (a test holds it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    command,
    storage_option,
    json_option,
    pack_options,
    progress_bar,
    quiet,
    reencode_options,
    scan_progress,
    write_json_report,
)

__all__ = ["COMMANDS", "pack_cmd"]


def _check_flag_format(fmt: str, ctx: click.Context) -> None:
    """Refuse the options of other formats (the registry's ``FormatSpec.options``: ``--max-count``,
    ``--max-bytes`` and ``--prefix`` are WebDataset's) given with this ``--format``."""
    from shardfeed.readers.registry import FORMATS, describe

    spec = describe(fmt)
    others = dict.fromkeys(o for s in FORMATS.values() for o in s.options if o not in spec.options)
    for name in others:
        src = ctx.get_parameter_source(name)
        if src is not None and src.name == "COMMANDLINE":
            flag = "--" + name.replace("_", "-")
            owners = [s for s in FORMATS.values() if name in s.options]
            writes = spec.noun(1) if not spec.sharded else spec.summary_noun + "s"
            raise click.UsageError(f"{flag} applies to {' or '.join(f'{s.title} {s.summary_noun}s' for s in owners)} "
                                   f"only; {spec.title} writes {writes} (drop {flag}, or use --format "
                                   f"{(owners[0].aliases or (owners[0].name,))[0]})")


@command("pack", short_help="Pack an image folder into WebDataset shards or one LMDB.")
@click.argument("src", metavar="SRC")
@click.argument("out", metavar="OUT")
@click.option("--extensions", default=None, metavar="LIST",
              help="Comma-separated extensions to pack, no dots, case-insensitive "
                   "[default: jpg,jpeg,png,ppm,bmp,pgm,tif,tiff,webp].")
@click.option("--classes-from", type=click.Path(path_type=Path), default=None, metavar="DATASET_OR_FILE",
              help="Use the class map of a packed dataset (e.g. the training split's folder or manifest.json), "
                   "or of a classes file (one name per line, index = line number), so labels match it; a "
                   "class it lacks is an error.")
@click.option("--labels", "labels_file", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              metavar="FILE", help="Labels from FILE instead of class folders: CSV/TSV rows path,label (a header "
                   "optional) or JSON Lines {\"path\": ..., \"label\": ...}; paths relative to SRC, labels class "
                   "names or integer indices. Images without a row and rows without an image stop the pack "
                   "(or are skipped and listed under --on-error skip).")
@click.option("--sidecars", default=None, metavar="LIST",
              help="Store each image's same-stem files as extra fields of its sample, e.g. txt,json,mask.png "
                   "(x.jpg + x.txt, x.json, x.mask.png); off unless given. Missing ones are counted in the "
                   "manifest.")
@click.option("--require-sidecars", is_flag=True, help="A missing sidecar is an error naming the image (with "
              "--on-error skip: the image is skipped and listed).")
@click.option("--no-labels", is_flag=True, help="Pack without labels (self-supervised corpora): no .cls "
              "members, no classes; readers give label -1. A SRC without sub-folders packs so by default.")
@json_option
@pack_options()
@reencode_options
@storage_option
@click.pass_context
def pack_cmd(ctx, src: Path, out: Path, extensions, classes_from, labels_file, sidecars, require_sidecars, no_labels,
             fmt, max_count, max_bytes, prefix, workers, read_ahead, seed, no_shuffle, on_error, decode_check,
             max_decode_bytes, resume, overwrite, executor, ray_address, json_path, reencode) -> None:
    """Pack the image folder SRC (ImageFolder layout: SRC/CLASS/IMAGE) into OUT.

    \b
    Other layouts: a folder plus a labels file (--labels FILE), images with sidecar
    files (--sidecars txt,json), or no labels at all (--no-labels, or a SRC without
    sub-folders); these pack in one process (--resume: WebDataset; re-encoding applies
    to the images, sidecar files are stored as they are).

    \b
    Classes are SRC's sorted sub-folders, as torchvision.datasets.ImageFolder finds them;
    hidden files and folders are ignored. Samples are shuffled (--seed) and keyed by their
    zero-padded position; each keeps its original bytes (unless re-encoded with --resize,
    --quality or --image-format), its class index and its metadata (original path, class
    name). OUT gets the shards (or data.mdb), an offset index per shard, and manifest.json,
    written last: a finished manifest means a finished dataset.

    \b
    Examples:
      shardfeed pack ~/data/train out/train --format wds --max-bytes 512MB
      shardfeed pack ~/data/val out/val --classes-from out/train/manifest.json
      shardfeed pack ~/data/train out/train --resume        # after a crash or kill -9
      shardfeed pack ~/data/train out/train-256 --resize 256   # shorter side 256 px, JPEG q90
      shardfeed pack ~/data/train s3://bucket/train --format wds
      shardfeed pack ~/data/val_flat out/val --labels val_labels.csv --classes-from out/train
      shardfeed pack ~/data/captions out/captions --sidecars txt,json --no-labels
    """
    from shardfeed.convert.pack import PackOptions, pack, prepare_output
    from shardfeed.convert.scan import scan_image_folder

    _check_flag_format(fmt.lower(), ctx)
    from shardfeed.convert.layouts import read_classes_file

    class_to_idx = read_classes_file(classes_from) if classes_from else None
    options = PackOptions(format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix, workers=workers,
                          read_ahead=read_ahead, seed=seed, shuffle=not no_shuffle, extensions=_split_ext(extensions),
                          on_error=on_error, decode_check=decode_check, max_decode_bytes=max_decode_bytes,
                          class_to_idx=class_to_idx,
                          resume=resume, overwrite=overwrite, reencode=reencode, executor=executor,
                          ray_address=ray_address)
    from shardfeed.readers.opener import check_supported, local_path, url_scheme
    from shardfeed.readers.registry import describe

    check_supported(out, what="`shardfeed pack`", hint="OUT may be a local folder or s3://BUCKET/PREFIX")
    to_store = url_scheme(out) == "s3"
    if to_store and not describe(fmt).remote_writable:
        raise ValueError(f"{out}: an LMDB dataset is written to a local disk only (LMDB maps its file into "
                         "memory); use --format wds to pack to a bucket, or pack to a local folder")
    if not to_store:
        out = local_path(out)
    check_supported(src, what="`shardfeed pack`", hint="SRC may be a local folder or s3://BUCKET/PREFIX")
    if url_scheme(src) == "s3":
        from shardfeed.convert.store_pack import mirror_store_folder

        if not quiet():
            click.echo(f"listing and downloading the image folder {src} ...", err=True)
        src_url = src
        # the listing's scan, rooted at the mirror: the pack accounts for the bucket's objects
        # (found, ignored, skipped) as for the files of a local folder, not for the mirror's
        bars = []

        def download_bar(num_files: int, num_bytes: int):
            bar, update = progress_bar(num_files, num_bytes, "download", quiet())
            bars.append(bar)
            return update

        try:
            src, scan = mirror_store_folder(src_url, extensions=options.extensions, class_to_idx=class_to_idx,
                                            on_error=options.on_error, progress=download_bar)
        finally:
            for bar in bars:
                bar.close()
    else:
        src_url = None
        src = local_path(src)
        scan = None
    if not src.exists():
        raise FileNotFoundError(f"{src}: source folder does not exist")
    if not to_store:
        prepare_output(src, out, resume=resume, overwrite=overwrite, check_only=True)
    flat = labels_file is None and not no_labels and not _has_class_folders(src)
    if labels_file is not None or sidecars or require_sidecars or no_labels or flat:
        if to_store or src_url is not None:
            raise click.UsageError("--labels, --sidecars and --no-labels (and a SRC without class folders) pack "
                                   "a local folder into a local OUT")
        if labels_file is not None and no_labels:
            raise click.UsageError("--labels and --no-labels exclude each other")
        from shardfeed.convert.layouts import LayoutOptions, pack_layout, parse_sidecars

        if flat and not quiet():
            click.echo(f"{src}: no class folders: packing an unlabelled dataset (readers give label -1); for "
                       "labels, pass --labels FILE or sort the images into SRC/CLASS/ folders", err=True)

        layout = LayoutOptions(labels_file=labels_file, no_labels=no_labels, sidecars=parse_sidecars(sidecars),
                               require_sidecars=require_sidecars)
        bar, update = progress_bar(None, None, f"pack {options.format}", quiet())
        try:
            report = pack_layout(src, out, options, layout, progress=update)
        finally:
            bar.close()
        _print_report(report, json_path)
        return
    if scan is None:
        bar, update = scan_progress(f"scan {src}", quiet())  # a million files on NFS take minutes
        try:
            scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=class_to_idx, progress=update)
        finally:
            bar.close()
    bar, update = progress_bar(len(scan.files), scan.num_bytes, f"pack {options.format}", quiet())
    try:
        output_progress = lambda output_bytes: update(0, 0, output_bytes)  # noqa: E731
        if to_store:
            from shardfeed.convert.store_pack import pack_to_store

            report = pack_to_store(src, out, options, progress=update, scan=scan, output_progress=output_progress)
        else:
            report = pack(src, out, options, progress=update, scan=scan, output_progress=output_progress)
    except KeyboardInterrupt as exc:
        bar.close()
        terminated = isinstance(exc, Terminated)
        if to_store:
            kept = f"the shards uploaded to {out} are kept: the same command plus --resume uploads the rest"
        else:
            from shardfeed.convert.pack import describe_interrupted

            kept = describe_interrupted(out)  # what is really there: complete shards, committed records
        click.echo(f"shardfeed: {'terminated' if terminated else 'interrupted'}; {kept}", err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    finally:
        bar.close()
    if src_url is not None:
        import shutil

        shutil.rmtree(src, ignore_errors=True)  # the local mirror of the bucket's folder
        report.source = src_url
    _print_report(report, json_path)


def _print_report(report, json_path) -> None:
    for item in report.skipped[:20]:
        click.echo(f"skipped {item['path']}: {item['reason']}", err=True)
    if len(report.skipped) > 20:
        click.echo(f"... and {len(report.skipped) - 20} more skipped (see the manifest)", err=True)
    click.echo(report.summary(), err=json_path == "-")
    write_json_report(json_path, report.to_json())


def _has_class_folders(src: Path) -> bool:
    """Whether SRC holds a non-hidden sub-folder (the class-folder layout)."""
    import os

    try:
        with os.scandir(src) as it:
            return any(not e.name.startswith(".") and e.is_dir() for e in it)
    except NotADirectoryError:
        return True  # the scan names the problem


def _split_ext(text: str | None):
    from shardfeed.convert.scan import parse_extensions

    return parse_extensions(text) if text else None


#: The commands :mod:`shardfeed.convert.cli` attaches to the ``shardfeed`` group.
COMMANDS = [pack_cmd]
