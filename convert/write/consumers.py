"""Files that let other tools open a WebDataset dataset as it is.

Beside ``manifest.json`` a packed WebDataset dataset gets:

* ``shardindex.json`` — the shard list of ``wids`` (webdataset's indexed reader), format
  ``wids-shard-index-v1``: per shard its ``url`` (relative to the index file), ``nsamples`` and
  ``filesize``; ``wids.ShardListDataset("OUT/shardindex.json")`` opens the dataset directly.
* ``README.md`` — a Hugging Face dataset card whose ``dataset_info`` declares the columns: one
  ``Image`` column per image extension present (``jpg``, ``png``..., from the manifest's
  ``extensions``), ``cls`` as a ``ClassLabel`` with the class names, ``json`` as a struct of the
  metadata fields, ``__key__`` and ``__url__`` as strings; and a ``configs`` entry whose data files
  are the shards. ``datasets.load_dataset("OUT")`` then reads every sample with those columns
  (without the card, the ``webdataset`` builder infers the columns from the first 5 samples: on a
  dataset mixing JPEG and PNG it drops one kind or refuses the dataset).

Neither file is written over a file of the same name that shardfeed did not write (a user's own
README, another tool's shard index): that file is kept and a warning logged. Both are small
(one line per shard for wids; the card lists the classes) and are rewritten with the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
from pathlib import Path

from shardfeed.readers.format.manifest import Manifest, created_by, split_member_name
from shardfeed.readers.file_io import write_bytes_atomic
from shardfeed.readers.format.registry import describe

__all__ = ["WIDS_INDEX_NAME", "CARD_NAME", "CARD_MARKER", "write_consumer_files", "wids_shard_index",
           "dataset_card", "metadata_fields", "field_examples", "is_ours", "dataset_name"]

log = logging.getLogger(__name__)

WIDS_INDEX_NAME = "shardindex.json"
CARD_NAME = "README.md"
#: First line of the dataset card's body: marks the card as shardfeed's (rewritten with the manifest).
CARD_MARKER = "<!-- written by shardfeed: rewritten with manifest.json; edit at your own risk -->"
#: Shards whose first sample's metadata is read to find the ``json`` struct's fields.
META_SAMPLE_SHARDS = 16
#: Largest JSON extra-field member read as the card's example, bytes (a larger one: declared a string).
MAX_FIELD_EXAMPLE_BYTES = 1 << 20
#: Deepest and widest JSON example declared as a ``struct`` (beyond: declared a string).
MAX_STRUCT_DEPTH = 16
MAX_STRUCT_KEYS = 1024


def wids_shard_index(manifest: Manifest, name: str) -> dict:
    """The ``wids-shard-index-v1`` description of a WebDataset manifest.

    Args:
        manifest: a WebDataset manifest.
        name: the dataset's name (wids shows it).

    Returns:
        ``{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name", "shardlist": [{"url",
        "nsamples", "filesize"}], "created_by"}`` and, for a dataset with extra fields, ``"fields": {name:
        member extension}``; urls are shard file names, relative to the index.
    """
    return {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": name,
        "created_by": manifest.created_by or created_by(),
        "shardlist": [{"url": s.name, "nsamples": s.num_samples, "filesize": s.num_bytes} for s in manifest.shards],
        # the extra fields' member names (manifest version 3), for a reader choosing what to decode
        **({"fields": {f: d["member"] for f, d in manifest.fields.items()}} if manifest.fields else {}),
    }


#: The largest ``json`` member :func:`metadata_fields` reads (shardfeed's hold a few hundred bytes).
META_MAX_BYTES = 1 << 20


def metadata_fields(root: str | os.PathLike, manifest: Manifest) -> dict:
    """The fields of the samples' ``json`` member, ``{name: example value}``, from the first sample
    of each of the first :data:`META_SAMPLE_SHARDS` shards (shardfeed writes the same fields for
    every sample of a pack: ``path``, ``class``, and the original size after a re-encode)."""
    fields: dict = {}
    for entry in manifest.shards[:META_SAMPLE_SHARDS]:
        try:
            with tarfile.open(Path(root) / entry.name, "r:") as tf:
                first_key = None
                for _ in range(16):  # the first sample's members
                    m = tf.next()
                    if m is None:
                        break
                    key, ext = split_member_name(m.name)
                    first_key = first_key or key
                    if key != first_key:
                        break
                    if ext == "json" and m.isfile():
                        if m.size > META_MAX_BYTES:  # a damaged size field, or not shardfeed's metadata
                            break
                        meta = json.loads(tf.extractfile(m).read())
                        if isinstance(meta, dict):
                            for k, v in meta.items():
                                fields.setdefault(k, v)
                        break
        except (OSError, tarfile.TarError, ValueError, RecursionError) as exc:  # RecursionError: JSON too deep
            log.debug("%s: no metadata fields read (%s)", entry.name, exc)
    return fields


def field_examples(root: str | os.PathLike, manifest: Manifest) -> dict:
    """``{field: parsed example}`` for the extra fields whose member is JSON, from the first
    samples of the first shard that has them (the card declares their struct)."""
    wanted = {d["member"]: f for f, d in (manifest.fields or {}).items() if d["member"].endswith("json")}
    found: dict = {}
    for entry in manifest.shards[:META_SAMPLE_SHARDS]:
        if len(found) == len(wanted):
            break
        try:
            with tarfile.open(Path(root) / entry.name, "r:") as tf:
                for _ in range(256):
                    m = tf.next()
                    if m is None:
                        break
                    _, ext = split_member_name(m.name)
                    if ext in wanted and wanted[ext] not in found and m.isfile():
                        if m.size > MAX_FIELD_EXAMPLE_BYTES:  # not read: the card declares it a string
                            found[wanted[ext]] = None
                        else:
                            found[wanted[ext]] = json.loads(tf.extractfile(m).read())
                        if len(found) == len(wanted):
                            break
        except (OSError, tarfile.TarError, ValueError, RecursionError) as exc:  # RecursionError: JSON too deep
            log.debug("%s: no field examples read (%s)", entry.name, exc)
    return found


def _field_feature_yaml(member: str, example) -> list[str]:
    """The ``dataset_info`` feature of an extra field's column (Hugging Face's webdataset builder
    decodes a member by its last extension: ``txt`` as text, ``json`` as JSON, images as Image)."""
    from shardfeed.readers.format.manifest import IMAGE_EXTENSIONS

    last = member.rsplit(".", 1)[-1]
    if last in IMAGE_EXTENSIONS:
        return [f"  - name: {_q(member)}", "    dtype: image"]
    if last in ("txt", "text"):
        return [f"  - name: {_q(member)}", "    dtype: string"]
    if last == "json" and isinstance(example, dict) and example and _struct_fits(example):
        return _feature_yaml(member, example, "  ")
    if last == "json":
        return [f"  - name: {_q(member)}", "    dtype: string"]  # a JSON list or scalar: not declared precisely
    return [f"  - name: {_q(member)}", "    dtype: binary"]


def _struct_fits(value, depth: int = 0, budget: list | None = None) -> bool:
    """Whether an example is small enough to declare as a ``struct``: nested at most
    :data:`MAX_STRUCT_DEPTH` deep, :data:`MAX_STRUCT_KEYS` keys in all (a JSON field from outside
    may be any size; a larger one is declared a string)."""
    budget = [MAX_STRUCT_KEYS] if budget is None else budget
    if depth > MAX_STRUCT_DEPTH:
        return False
    if isinstance(value, dict):
        budget[0] -= len(value)
        return budget[0] >= 0 and all(_struct_fits(v, depth + 1, budget) for v in value.values())
    return True


#: Characters a YAML 1.1 reader (PyYAML, which reads a Hugging Face card) folds as line breaks or
#: refuses as unprintable: escaped as ``\uXXXX`` in a card's strings, so each name reads back as written.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


def _q(text: str) -> str:
    """A YAML scalar: JSON's double-quoted string is valid YAML; the characters YAML 1.1 folds or
    refuses (:data:`_YAML_UNSAFE`) are escaped, the rest kept as they are (readable class names)."""
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(str(text), ensure_ascii=False))


def _feature_yaml(name: str, value, indent: str) -> list[str]:
    """YAML lines of one ``dataset_info`` feature inferred from an example value."""
    head = f"{indent}- name: {_q(name)}"
    if isinstance(value, dict) and not _struct_fits(value, len(indent) // 2):
        return [head, f"{indent}  dtype: string"]  # too deep or too wide to declare
    if isinstance(value, dict):
        lines = [head, f"{indent}  struct:"]
        for k, v in value.items():
            lines += _feature_yaml(k, v, indent + "  ")
        return lines
    if isinstance(value, list):
        inner = value[0] if value else ""
        if isinstance(inner, (dict, list)):
            return [head, f"{indent}  dtype: string"]  # not declared precisely; rare in our metadata
        return [head, f"{indent}  list:", f"{indent}    dtype: {_dtype(inner)}"]
    return [head, f"{indent}  dtype: {_dtype(value)}"]


def _dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    return "string"


def dataset_card(manifest: Manifest, meta_fields: dict, *, name: str, extra_examples: dict | None = None) -> str:
    """A Hugging Face dataset card (``README.md``) declaring the dataset's columns.

    Args:
        manifest: a WebDataset manifest (version 2: its ``extensions`` give the image columns).
        meta_fields: ``{field: example value}`` of the ``json`` member (:func:`metadata_fields`).
        name: the dataset's name (the card's title).
        extra_examples: ``{field: example value}`` of the JSON extra fields (:func:`field_examples`);
            each extra field is a column named by its member (``txt``: string, ``mask.png``:
            image, ``sidecar.json``: a struct, others binary).

    Returns:
        The card's text: YAML front matter (``dataset_info.features``, ``configs``) and a short body.

    Raises:
        ValueError: the manifest does not record its image extensions (version 1: rebuild it
            with ``shardfeed index`` or repack).
    """
    exts = manifest.image_extensions
    if not exts:
        raise ValueError("the manifest does not record the image extensions (manifest version 1); "
                         "rewrite it with `shardfeed index DIR --overwrite` or repack to get a dataset card")
    prefixes = sorted({s.name.rsplit("-", 1)[0] if "-" in s.name else s.name[:-4] for s in manifest.shards})
    lines = ["---", "dataset_info:", "  features:"]
    for ext in exts:
        lines += [f"  - name: {_q(ext)}", "    dtype: image"]
    if manifest.labelled:  # an unlabelled dataset (manifest version 3) has no cls member
        lines += ["  - name: cls", "    dtype:", "      class_label:", "        names:"]
        lines += [f"          {_q(str(i))}: {_q(c)}" for i, c in enumerate(manifest.classes)]
    for name, desc in (manifest.fields or {}).items():  # extra fields (sidecars), by their member name
        lines += _field_feature_yaml(desc["member"], (extra_examples or {}).get(name))
    if meta_fields:
        lines += ["  - name: json", "    struct:"]
        for k, v in meta_fields.items():
            lines += _feature_yaml(k, v, "    ")
    lines += ["  - name: __key__", "    dtype: string", "  - name: __url__", "    dtype: string"]
    lines += ["configs:", "- config_name: default", "  data_files:", "  - split: train", "    path:"]
    lines += [f"    - {_q(p + '-*.tar')}" for p in prefixes]
    lines += ["---", "", CARD_MARKER, "", f"# {name}", ""]
    counts = ", ".join(f"{n} {e}" for e, n in (manifest.extensions or {}).items())
    lines += [
        f"{manifest.num_samples} images ({counts}) in {len(manifest.classes)} classes, "
        f"{len(manifest.shards)} WebDataset shard{'' if len(manifest.shards) == 1 else 's'} packed by "
        f"{manifest.created_by}. Each sample holds its "
        "image under its own extension (one column per extension; the others are empty), its class "
        "index (`cls`) and its metadata (`json`: the original path and class).",
        "",
    ]
    if manifest.fields or not manifest.labelled:
        extra = ", ".join(f"`{d['member']}` ({d['count']} samples)" for d in manifest.fields.values())
        lines += [("Unlabelled: no `cls` column. " if not manifest.labelled else "")
                  + (f"Extra fields (sidecar files): {extra}." if extra else ""), ""]
    lines += [
        "```python",
        "import datasets",
        "ds = datasets.load_dataset(\"PATH/TO/THIS/FOLDER\", split=\"train\")",
        "```",
        "",
        "Other readers: `shardfeed.readers.open_dataset(\"PATH\")`, `wids.ShardListDataset(\"PATH/shardindex.json\")`, "
        "NVIDIA DALI `fn.readers.webdataset(paths=..., ext=[\"" + ";".join(exts) + "\", \"cls\", \"json\"])` "
        "(`wds2idx` writes its `.idx` beside each shard; shardfeed's own index is `.sfidx`).",
        "",
    ]
    return "\n".join(lines)


def dataset_name(manifest: Manifest) -> str:
    """A name for the dataset that depends on its content only: ``shardfeed-`` and 12 hex digits of
    the shards' hashes (or names and sizes), so packing the same input anywhere gives the same name."""
    h = hashlib.sha256()
    for s in manifest.shards:
        h.update(f"{s.name}\0{s.num_samples}\0{s.num_bytes}\0{s.sha256 or ''}\n".encode())
    return f"shardfeed-{h.hexdigest()[:12]}"


def is_ours(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a ``README.md`` or ``shardindex.json``) was written by shardfeed."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if p.name == CARD_NAME:
        return CARD_MARKER.encode() in head
    if p.name == WIDS_INDEX_NAME:
        try:
            return str(json.loads(head).get("created_by", "")).startswith("shardfeed")
        except (ValueError, AttributeError):
            return False
    return False


def write_consumer_files(root: str | os.PathLike, manifest: Manifest, *, name: str | None = None) -> list[str]:
    """Write ``shardindex.json`` (wids) and ``README.md`` (Hugging Face) beside a WebDataset manifest.

    Nothing is written for LMDB. A file of either name that shardfeed did not write is kept (a
    warning is logged); the card is left out when the manifest does not record its extensions.

    Args:
        root: the dataset folder (the shards and ``manifest.json``).
        manifest: its manifest.
        name: the dataset's name; default :func:`dataset_name` (from the content, so the same
            input gives the same files wherever OUT or SRC is).

    Returns:
        The names of the files written.

    Raises:
        OSError: writing failed.
    """
    if not describe(manifest.format).tar_shards:
        return []
    root = Path(root)
    name = name or dataset_name(manifest)
    written = []
    files = {WIDS_INDEX_NAME: lambda: (json.dumps(wids_shard_index(manifest, name), indent=1) + "\n").encode()}
    if manifest.image_extensions:
        files[CARD_NAME] = lambda: dataset_card(manifest, metadata_fields(root, manifest), name=name,
                                                extra_examples=field_examples(root, manifest)).encode("utf-8")
    for fname, make in files.items():
        path = root / fname
        if path.exists() and not is_ours(path):
            log.warning("%s: not written by shardfeed; kept (the %s file for %s is not written)", path, fname,
                        "wids" if fname == WIDS_INDEX_NAME else "Hugging Face datasets")
            continue
        write_bytes_atomic(path, make())
        written.append(fname)
    return written
