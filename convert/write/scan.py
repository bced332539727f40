"""ImageFolder scanning for the packers: the rules live in :mod:`shardfeed.readers.format.imagefolder`.

The scan belongs to the readers (the folder source reads with the same rules, and readers never
import convert); this module re-exports it under its historical name.
"""

from shardfeed.readers.format.imagefolder import (  # noqa: F401
    ScannedFile,
    ScannedFiles,
    ScanResult,
    find_classes,
    new_scanned_file,
    parse_extensions,
    scan_image_folder,
)

__all__ = ["ScannedFile", "ScannedFiles", "new_scanned_file", "ScanResult", "scan_image_folder", "find_classes",
           "parse_extensions"]
