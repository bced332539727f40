"""The ``shardfeed`` command line (Click group).

Conventions (DESIGN.md, "CLI conventions"): every reporting command takes ``--json PATH`` (``-``
for stdout) and writes its full report there; sizes accept ``KB/MB/GB`` (powers of 1000) and
``KiB/MiB/GiB``; lists are comma-separated. Library errors become one line on stderr and a
non-zero exit status, never a traceback. Commands import their heavy modules lazily, so
``shardfeed pack`` never imports torch.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Callable

import click

from shardfeed.readers.cli_common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    SizeParam,
    Terminated,
    fail_cleanly,
    json_option,
    progress_bar,
    stop_on_sigterm,
    write_json_report,
)

from .reencode import reencode_options

__all__ = ["main", "command", "pack_options"]

log = logging.getLogger("shardfeed")

def command(group: click.Group, *args, **kwargs) -> Callable:
    """Register a command on ``group`` with clean error handling."""

    def deco(f):
        return group.command(*args, **kwargs)(fail_cleanly(f))

    return deco


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="shardfeed", prog_name="shardfeed")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.option("-q", "--quiet", is_flag=True,
              help="No progress bar and no warnings (errors and the one-line summary still print).")
@click.pass_context
def main(ctx: click.Context, verbose: int, quiet: bool) -> None:
    """shardfeed: pack image folders into WebDataset shards or LMDB, and read them back fast.

    \b
    Typical use:
      shardfeed pack data/train out/train-wds --format wds      # ImageFolder -> .tar shards
      shardfeed pack data/train out/train-lmdb --format lmdb    # ImageFolder -> one LMDB
      shardfeed verify data/train out/train-wds                 # same training loop, before vs after

    Every command explains its options with --help; every report has a --json form.
    """
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit gives EFBIG (a clear error), not death
    stop_on_sigterm()  # SIGTERM stops a command as Ctrl-C does: workers ended, partial files removed, one line
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="shardfeed: %(levelname)s: %(message)s", stream=sys.stderr)
    ctx.ensure_object(dict)
    ctx.obj["quiet"] = quiet


def pack_options(f: Callable) -> Callable:
    """The options shared by ``pack`` and ``convert`` (kebab-case of :class:`PackOptions`)."""
    opts = [
        click.option("--format", "-f", "fmt", type=click.Choice(["wds", "webdataset", "lmdb"], case_sensitive=False),
                     default="wds", show_default=True,
                     help="Output format: WebDataset .tar shards (wds) or one LMDB database (lmdb)."),
        click.option("--max-count", type=click.IntRange(min=1), default=10000, show_default=True,
                     help="WebDataset: samples per shard at most."),
        click.option("--max-bytes", type=SizeParam(), default="256MB", show_default=True,
                     help="WebDataset: size of a shard file at most (headers and padding included); "
                          "e.g. 512MB, 1GiB."),
        click.option("--prefix", default="shard", show_default=True,
                     help="WebDataset: shard file prefix ({prefix}-000000.tar)."),
        click.option("--workers", "-j", type=click.IntRange(min=1), default=None,
                     help="Processes that read and write shards [default: CPU count]."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the packing-order shuffle (so no shard holds one class only)."),
        click.option("--no-shuffle", is_flag=True, help="Keep sorted ImageFolder order instead of shuffling."),
        click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
                     help="On an unreadable or (with --decode-check) undecodable file: stop naming it, "
                          "or skip it and list it in the manifest."),
        click.option("--decode-check", is_flag=True,
                     help="Fully decode every image while packing (the readers' exact rules); bytes are still "
                          "stored unchanged."),
        click.option("--resume", is_flag=True,
                     help="Finish an interrupted pack in OUT: complete shards are kept, the rest rewritten."),
        click.option("--overwrite", is_flag=True, help="Replace an existing dataset in OUT."),
        click.option("--executor", type=click.Choice(["local", "ray"], case_sensitive=False), default="local",
                     show_default=True,
                     help="Where the tasks run: this machine's --workers processes, or a Ray cluster (one task "
                          "per shard; SRC and OUT must be on storage every node mounts at the same path). "
                          "Same output bytes either way. Needs pip install 'shardfeed[ray]'."),
        click.option("--ray-address", default=None, metavar="ADDR",
                     help="--executor ray: the cluster to use (auto, HOST:PORT) [default: $RAY_ADDRESS, "
                          "else a local Ray instance with --workers CPUs]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return json_option(f)


def _check_flag_format(fmt: str, ctx: click.Context) -> None:
    """Refuse tar-only options with --format lmdb."""
    if fmt != "lmdb":
        return
    for name in ("max_count", "max_bytes", "prefix"):
        src = ctx.get_parameter_source(name)
        if src is not None and src.name == "COMMANDLINE":
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"{flag} applies to WebDataset shards only; LMDB writes one database "
                                   f"(drop {flag}, or use --format wds)")


@command(main, "pack", short_help="Pack an image folder into WebDataset shards or one LMDB.")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--extensions", default=None, metavar="LIST",
              help="Comma-separated extensions to pack, no dots, case-insensitive "
                   "[default: jpg,jpeg,png,ppm,bmp,pgm,tif,tiff,webp].")
@click.option("--classes-from", type=click.Path(path_type=Path), default=None, metavar="MANIFEST",
              help="Use the class map of a packed dataset (e.g. the training split's manifest.json) so "
                   "labels match it; a class folder it lacks is an error.")
@pack_options
@reencode_options
@click.pass_context
def pack_cmd(ctx, src: Path, out: Path, extensions, classes_from, fmt, max_count, max_bytes, prefix, workers,
             seed, no_shuffle, on_error, decode_check, resume, overwrite, executor, ray_address, json_path,
             reencode) -> None:
    """Pack the image folder SRC (ImageFolder layout: SRC/CLASS/IMAGE) into OUT.

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
    """
    from .pack import PackOptions, load_class_map, pack, prepare_output
    from .scan import scan_image_folder

    _check_flag_format(fmt.lower(), ctx)
    class_to_idx = load_class_map(classes_from) if classes_from else None
    options = PackOptions(format=fmt, max_count=max_count, max_bytes=max_bytes, prefix=prefix, workers=workers,
                          seed=seed, shuffle=not no_shuffle, extensions=_split_ext(extensions),
                          on_error=on_error, decode_check=decode_check, class_to_idx=class_to_idx,
                          resume=resume, overwrite=overwrite, reencode=reencode, executor=executor,
                          ray_address=ray_address)
    if not src.exists():
        raise FileNotFoundError(f"{src}: source folder does not exist")
    prepare_output(src, out, resume=resume, overwrite=overwrite, check_only=True)
    scan = scan_image_folder(src, extensions=options.extensions, class_to_idx=class_to_idx)
    quiet = ctx.obj.get("quiet", False)
    bar, update = progress_bar(len(scan.files), scan.num_bytes, f"pack {options.format}", quiet)
    try:
        report = pack(src, out, options, progress=update, scan=scan)
    except KeyboardInterrupt as exc:
        bar.close()
        terminated = isinstance(exc, Terminated)
        click.echo(f"shardfeed: {'terminated' if terminated else 'interrupted'}; the complete part of {out} is "
                   "kept: finish it with the same command plus --resume", err=True)
        sys.exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
    finally:
        bar.close()
    for item in report.skipped[:20]:
        click.echo(f"skipped {item['path']}: {item['reason']}", err=True)
    if len(report.skipped) > 20:
        click.echo(f"... and {len(report.skipped) - 20} more skipped (see the manifest)", err=True)
    click.echo(report.summary(), err=json_path == "-")
    write_json_report(json_path, report.to_json())


def _split_ext(text: str | None):
    from .scan import parse_extensions

    return parse_extensions(text) if text else None


def _register_more_commands() -> None:
    """Attach the commands that live in other modules (each imports its heavy parts lazily).

    A module listed here exposes ``COMMANDS`` (a list of click commands); modules of
    ``shardfeed.readers`` define plain commands, since readers never import convert.
    """
    import importlib

    for mod in ("shardfeed.convert.tools_cli", "shardfeed.readers.measure_cli"):
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise
            continue
        for cmd in module.COMMANDS:
            main.add_command(cmd)


_register_more_commands()


if __name__ == "__main__":
    main()
