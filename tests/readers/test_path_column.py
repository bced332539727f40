"""PathColumn: compact relative paths that read back exactly as planted."""

import pickle
from array import array

import pytest

from shardfeed.readers.format import path_column
from shardfeed.readers.format.folder_walk import FolderListing
from shardfeed.readers.format.path_column import PathColumn

PLANTED = ["cat/a.jpg", "cat/b.jpg", "cat/sub/c.png", "dog/é ü.jpg", "dog/caf\udce9.jpg", "top.jpg", "dog/x.jpeg"]


def test_paths_read_back_as_planted():
    col = PathColumn.from_paths(PLANTED)
    assert len(col) == len(PLANTED)
    assert list(col) == PLANTED
    assert [col[i] for i in range(len(PLANTED))] == PLANTED
    assert col[-1] == PLANTED[-1] and col[-len(PLANTED)] == PLANTED[0]
    with pytest.raises(IndexError):
        col[len(PLANTED)]
    assert sorted(col.folders) == ["", "cat/", "cat/sub/", "dog/"]  # each folder part stored once


def test_slices_and_gathers_keep_the_order():
    col = PathColumn.from_paths(PLANTED)
    assert list(col[2:5]) == PLANTED[2:5]
    assert col.take([6, 0, 3]) == [PLANTED[6], PLANTED[0], PLANTED[3]]
    assert isinstance(col.take([1, 2]), list)  # a shard's rows: plain strings


def test_a_large_gather_stays_compact(monkeypatch):
    monkeypatch.setattr(path_column, "MAX_LISTED_TAKE", 3)
    col = PathColumn.from_paths(PLANTED)
    order = [5, 4, 3, 2, 1, 0, 6]
    taken = col.take(order)
    assert isinstance(taken, PathColumn)
    assert list(taken) == [PLANTED[i] for i in order]


def test_pickles_to_the_same_paths():
    col = PathColumn.from_paths(PLANTED)
    back = pickle.loads(pickle.dumps(col))
    assert list(back) == PLANTED
    back.append(back.folder("cat/"), "z.jpg")  # still appendable, folder parts reused
    assert back[-1] == "cat/z.jpg" and back.folders.count("cat/") == 1


def test_eight_byte_offsets_past_four_gib(monkeypatch):
    col = PathColumn(ends=array("I", [2 ** 32 - 1]), folder_codes=array("I", [0]), folders=[""])
    col.names = bytearray()  # the 4 GiB of names are not made: the next end offset is past 2**32 - 1

    class Huge(bytearray):
        def __len__(self):
            return 2 ** 32 + 5

    col.names = Huge()
    col.append(0, "x.jpg")
    assert col.ends.typecode == "Q" and list(col.ends) == [2 ** 32 - 1, 2 ** 32 + 5]


def test_folder_listing_reads_each_folder_sorted_and_drains():
    listing = FolderListing()
    listing.add("/r/b", ["z.jpg", "a.jpg"])
    listing.add("/r/a", [])
    listing.sort()
    assert list(listing) == [("/r/a", []), ("/r/b", ["a.jpg", "z.jpg"])]
    assert listing[1] == ("/r/b", ["a.jpg", "z.jpg"])
    assert list(listing.drain()) == [("/r/a", []), ("/r/b", ["a.jpg", "z.jpg"])]
    assert len(listing) == 0
