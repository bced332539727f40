"""``shardfeed pack``: an image folder into WebDataset shards or one LMDB (over
:func:`shardfeed.convert.write.pack.pack`).

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
    json_option,
    pack_options,
    quiet,
    reencode_options,
    write_json_report,
)
from .storage_options import storage_option, storage_options_of
from .progress import progress_bar, scan_progress

__all__ = ["COMMANDS", "pack_cmd"]


def _fault_hooks(ctx: click.Context):
    """The test fault hooks handed to the group as its context object (``main(args, obj={"faults":
    FaultHooks(...)})``, as ``tests/hooked_cli.py`` runs the CLI); None otherwise (production)."""
    obj = ctx.find_root().obj
    return obj.get("faults") if isinstance(obj, dict) else None


def _check_flag_format(fmt: str, ctx: click.Context) -> None:
    """Refuse the options of other formats (the registry's ``FormatSpec.options``: ``--max-count``,
    ``--max-bytes`` and ``--prefix`` are WebDataset's) given with this ``--format``."""
    from shardfeed.readers.format.registry import FORMATS, describe

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


@command("pack", reads=("src", "labels_file", "classes_from"), writes=("out",),
         short_help="Pack an image folder into WebDataset shards or one LMDB.")
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
@click.option("--num-classes", type=click.IntRange(min=1), default=None, metavar="K",
              help="With --labels: integer labels index the classes 0 .. K-1 (a label of K or more is an error "
                   "naming its line). Without it (and without --classes-from) the largest label must be below "
                   "the number of labelled images.")
@click.option("--label-kind", type=click.Choice(["name", "index"]), default=None,
              help="With --labels: a label written as digits is a class name or a class index. Needed only when "
                   "a label is both (class names that are digits, with --classes-from).")
@click.option("--sidecars", default=None, metavar="LIST",
              help="Store each image's same-stem files as extra fields of its sample, e.g. txt,json,mask.png "
                   "(x.jpg + x.txt, x.json, x.mask.png); off unless given. Missing ones are counted in the "
                   "manifest.")
@click.option("--require-sidecars", is_flag=True, help="A missing sidecar is an error naming the image (with "
              "--on-error skip: the image is skipped and listed).")
@click.option("--no-labels", is_flag=True, help="Pack without labels (self-supervised corpora): no .cls "
              "members, no classes; readers give label -1. A SRC without sub-folders packs so by default.")
@click.option("--follow-external-links", is_flag=True,
              help="Follow symbolic links whose target lies outside SRC (a git-annex or DVC store keeps its "
                   "objects elsewhere). Without it such a link stops the pack, naming it (with --on-error skip: "
                   "skipped and listed as 'link out of SRC'). Links inside SRC are always followed.")
@click.option("--append", is_flag=True, help="Add SRC's images to the finished WebDataset dataset in OUT as new "
              "shards: its shards and class indices stay; new classes get the next indices; images whose path "
              "it holds are skipped and counted. An append that stops leaves the dataset as it was; run it "
              "again to finish it.")
@click.option("--skip-changed", is_flag=True, help="With --append: skip a file at a path the dataset holds "
              "whose size or modification time changed since it was packed. Without it such a file stops the "
              "append, naming it (repack with --overwrite, or give the file a new path).")
@json_option
@pack_options()
@reencode_options
@storage_option
@click.pass_context
def pack_cmd(ctx, src: Path, out: Path, extensions, classes_from, labels_file, num_classes, label_kind, sidecars,
             require_sidecars, no_labels, follow_external_links, append, skip_changed,
             fmt, max_count, max_bytes, prefix, workers, read_ahead, seed, no_shuffle, on_error, decode_check,
             max_decode_bytes, resume, overwrite, executor, ray_address, json_path, reencode) -> None:
    """Pack the image folder SRC (ImageFolder layout: SRC/CLASS/IMAGE) into OUT.

    \b
    Other layouts: a folder plus a labels file (--labels FILE), images with sidecar
    files (--sidecars txt,json), or no labels at all (--no-labels, or a SRC without
    sub-folders); these take -j, --executor ray, --resume and a bucket SRC or OUT as
    class folders do (re-encoding applies to the images, sidecar files are stored as
    they are; with a bucket SRC, --labels FILE is a local file).

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
      shardfeed pack ~/data/new_day out/train --append      # add images as new shards
      shardfeed pack ~/data/train out/train-256 --resize 256   # shorter side 256 px, JPEG q90
      shardfeed pack ~/data/train s3://bucket/train --format wds
      shardfeed pack ~/data/val_flat out/val --labels val_labels.csv --classes-from out/train
      shardfeed pack ~/data/captions out/captions --sidecars txt,json --no-labels
    """
    from shardfeed.convert.write.layouts import LayoutOptions, parse_sidecars, read_classes_file
    from shardfeed.convert.write.pack import PackOptions, describe_interrupted, pack

    _check_flag_format(fmt.lower(), ctx)
    if labels_file is not None and no_labels:
        raise click.UsageError("--labels and --no-labels exclude each other")
    if (num_classes is not None or label_kind is not None) and labels_file is None:
        raise click.UsageError("--num-classes and --label-kind say what the labels of --labels FILE mean; "
                               "pass --labels")
    if num_classes is not None and classes_from is not None:
        raise click.UsageError("--num-classes and --classes-from both give the classes; pass one")
    class_to_idx = read_classes_file(classes_from) if classes_from else None
    options = PackOptions(format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix, workers=workers,
                          read_ahead=read_ahead, seed=seed, shuffle=not no_shuffle, extensions=_split_ext(extensions),
                          on_error=on_error, decode_check=decode_check, max_decode_bytes=max_decode_bytes,
                          class_to_idx=class_to_idx,
                          resume=resume, append=append, skip_changed=skip_changed, overwrite=overwrite,
                          reencode=reencode, executor=executor,
                          ray_address=ray_address, faults=_fault_hooks(ctx),
                          follow_external_links=follow_external_links)
    layout = None
    if labels_file is not None or sidecars or require_sidecars or no_labels:
        layout = LayoutOptions(labels_file=labels_file, no_labels=no_labels, sidecars=parse_sidecars(sidecars),
                               require_sidecars=require_sidecars, num_classes=num_classes, label_kind=label_kind)
    bars = _Bars(f"pack {options.format}", f"scan {src}")
    try:
        report = pack(src, out, options, layout=layout, progress=bars.update, output_progress=bars.output,
                      scan_progress=bars.scan, download_progress=bars.download, start_progress=bars.start,
                      notice=bars.notice,
                      storage_options=storage_options_of(ctx))
    except KeyboardInterrupt as exc:
        bars.close()
        terminated = isinstance(exc, Terminated)
        kept = describe_interrupted(out)  # what is really there: complete shards, committed records
        click.echo(f"shardfeed: {'terminated' if terminated else 'interrupted'}; {kept}", err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    finally:
        bars.close()
    _print_report(report, json_path)


class _Bars:
    """The progress bars of a pack, opened as its phases start: the download of a bucket SRC,
    the scan, the pack (its total known once the scan is done)."""

    def __init__(self, desc: str, scan_desc: str):
        self.desc, self.scan_desc = desc, scan_desc
        self.bars: list = []
        self._scan = self._pack = None

    def download(self, num_files: int, num_bytes: int):
        bar, update = progress_bar(num_files, num_bytes, "download", quiet())
        self.bars.append(bar)
        return update

    def scan(self, phase: str, n: int) -> None:
        if self._scan is None:
            bar, self._scan = scan_progress(self.scan_desc, quiet())  # a million files on NFS take minutes
            self.bars.append(bar)
        self._scan(phase, n)

    def start(self, num_files: int | None, num_bytes: int | None) -> None:
        self._close_all()  # the scan (or download) is over
        bar, self._pack = progress_bar(num_files, num_bytes, self.desc, quiet())
        self.bars.append(bar)

    def update(self, n: int, nbytes: int, output_bytes: int = 0) -> None:
        if self._pack is None:  # a layout pack: no totals
            self.start(None, None)
        self._pack(n, nbytes, output_bytes)

    def output(self, output_bytes: int) -> None:
        self.update(0, 0, output_bytes)

    def notice(self, text: str) -> None:
        if not quiet():
            click.echo(text, err=True)

    def _close_all(self) -> None:
        for bar in self.bars:
            bar.close()
        self.bars.clear()

    def close(self) -> None:
        self._close_all()


def _print_report(report, json_path) -> None:
    for item in report.skipped[:20]:
        click.echo(f"skipped {item['path']}: {item['reason']}", err=True)
    if len(report.skipped) > 20:
        click.echo(f"... and {len(report.skipped) - 20} more skipped (see the manifest)", err=True)
    click.echo(report.summary(), err=json_path == "-")
    write_json_report(json_path, report.to_json())


def _split_ext(text: str | None):
    from shardfeed.convert.write.scan import parse_extensions

    return parse_extensions(text) if text else None


#: The commands :mod:`shardfeed.convert.cli` attaches to the ``shardfeed`` group.
COMMANDS = [pack_cmd]
