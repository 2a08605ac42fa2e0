"""The program file's pages under a cpu delegate's constants: which the engine gives back
after init, which tables it reads from the file instead of through the mapping.

# Design
#
# A program loaded from a file (``opforge.program.load``) holds its constants in one
# read-only shared mapping; the engine borrows them in place (``engine.Engine._build``).
# Three kinds of constant, by how the engine's ops read them:
#
# - copied at init (convolution and matmul weights, reordered into oneDNN's layouts): the
#   file's pages are given back once the op is built, or the weights would be resident
#   twice;
# - read in place on every call (a binary operand, a post-op's, a gathered table read
#   through the mapping): their pages stay, or each call would fault them in again;
# - an embedding's table over 1 MiB, from a mapping whose file is open beside it
#   (``ProgramMapping.fd``): the engine reads its rows with ``pread`` (``ofc_tensor_file``),
#   so its pages are given back too unless another op reads the table in place (a smaller
#   table is read in place: its pages cost less than the reads).
#
# A weight copied at init from such a mapping is also given to the engine as a range of the
# file, flagged droppable: the engine reorders a large one in chunks and drops each chunk's
# pages as it goes, so the peak of init is the copies plus one chunk, not plus the largest
# weight.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = ["COPIED_AT_INIT", "GATHERED", "FilePages", "PagePlan"]


# op kinds whose constant operands after the first (weights, biases, weight scales) the
# engine copies at init (reorder_const; a quantized op's scales memcpy'd): never read again
COPIED_AT_INIT = frozenset({"conv", "deconv", "matmul", "qconv", "qmatmul", "int_dot_matmul",
                            "int_matmul"})
# op kinds that read a few rows of their first operand per call (a table)
GATHERED = frozenset({"embedding", "index"})
# an embedding table up to this size is read through the mapping, not from the file: all of
# it resident costs at most this, and a pread per row costs ~0.4 µs (the zoo gpt_decoder's
# 32 token rows of a 64 KB table took 13.5 µs of its 78 µs call, 0.5 µs as copies)
FILE_READ_FROM = 1 << 20


def _read_in_place(plan: dict, roots: list[int], root: int) -> bool:
    """Does an op other than an embedding gather read constant ``root`` on every call (a
    binary op, a post-op operand, a gather of another kind)?"""
    for op in plan["ops"]:
        ins = op["in"][:1] if op["kind"] in COPIED_AT_INIT else \
            op["in"][1:] if op["kind"] == "embedding" else op["in"]
        if any(roots[t] == root for t in ins) or any(
                p[0] == 1 and roots[p[4]] == root for p in op["post"]):
            return True
    return False


class FilePages:
    """Gives back the resident pages of a blob's constants once the engine has copied them.

    A program loaded from a file keeps its segments in a shared read-only mapping
    (``opforge.program.load``): each constant the engine reads at init becomes resident
    there, beside the engine's own copy (and the layout oneDNN reorders weights into), so a
    weight-heavy delegate held its weights twice for as long as it lived, and three times
    at the peak of its init. ``madvise(MADV_DONTNEED)`` drops this process's pages of such
    a mapping: a later read (a crash report, ``describe_blob``) faults them in again from
    the file, unchanged. Only for a mapping nobody can write (its memoryview is read-only):
    on a private or anonymous mapping the call would discard data. Whole pages inside each
    constant only; a page it shares with its neighbours stays."""

    _PAGE = mmap.PAGESIZE

    def __init__(self, mapping: mmap.mmap, start: int) -> None:
        self.mapping = mapping
        self.start = start  # the mapping's address (file offset 0: a whole file mapped)
        # the file, open beside the mapping (opforge.program.load's ProgramMapping): the
        # engine may pread a gathered table's rows from it (file_source)
        self.fd = getattr(mapping, "fd", None)

    @classmethod
    def of(cls, data: memoryview) -> "FilePages | None":
        mapping = getattr(data, "obj", None)
        if not isinstance(mapping, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return None
        whole = memoryview(mapping)
        try:
            if not whole.readonly:  # ACCESS_WRITE / ACCESS_COPY: pages may hold writes
                return None
            start = np.frombuffer(whole, np.uint8).ctypes.data
        finally:
            whole.release()
        return cls(mapping, start)

    def __call__(self, address: int, nbytes: int) -> None:
        self._advise(address, nbytes, mmap.MADV_DONTNEED)

    def gathered(self, address: int, nbytes: int) -> None:
        """A table read a few rows per call (an embedding): the kernel maps a file's pages
        in large chunks around each fault, so 160 token rows of a 98 MB embedding table
        made all of it resident; with huge pages and read-around off on its range, a third
        of it on the machine this was measured on (how much is the kernel's choice: its
        page-cache folios can be as large)."""
        for advice in ("MADV_NOHUGEPAGE", "MADV_RANDOM"):
            if hasattr(mmap, advice):
                self._advise(address, nbytes, getattr(mmap, advice))

    def _advise(self, address: int, nbytes: int, advice: int) -> None:
        page = self._PAGE
        first = -(-(address - self.start) // page) * page
        end = (address + nbytes - self.start) // page * page
        if end > first:
            self.mapping.madvise(advice, first, end - first)


class PagePlan:
    """For one engine's plan: the constants that are ranges of the program file
    (``file_sources``: ``(root tensor, fd, file offset, flags)``, for ``ofc_tensor_file``)
    and, per op as it is built,
    the pages to give back (``give_back``). ``spans``: constant root → (address, bytes,
    its ``FilePages`` or None); ``borrowed``: the roots the engine reads in place."""

    def __init__(self, plan: dict, roots: list[int], spans: dict[int, tuple[int, int, Any]],
                 borrowed: dict[int, bool]) -> None:
        self.roots, self.spans = roots, spans
        ops = plan["ops"]
        # constants some op reads in place on every call (a gather's table, a binary or
        # post-op operand): their pages stay, or each call would fault them in again (an
        # embedding table given back cost a decoder 0.56 ms per token in page faults)
        self.in_place = {roots[t] for op in ops for t in (
            op["in"] if op["kind"] not in COPIED_AT_INIT else op["in"][:1])}
        self.in_place |= {roots[p[4]] for op in ops for p in op["post"] if p[0] == 1}
        # tables gathered a few rows per call: an embedding's rows are read from the program
        # file where the engine borrows the table from a file mapping, else through the
        # mapping, hinted
        self.file_read: set[int] = set()
        for op in ops:
            if op["kind"] not in GATHERED or not op["in"]:
                continue
            root = roots[op["in"][0]]
            address, nbytes, pages = spans.get(root, (0, 0, None))
            if pages is None or not nbytes:
                continue
            if op["kind"] == "embedding" and pages.fd is not None and borrowed.get(root) \
                    and nbytes > FILE_READ_FROM:
                self.file_read.add(root)
            pages.gathered(address, nbytes)
        self.in_place -= {r for r in self.file_read if not _read_in_place(plan, roots, r)}
        # the constants the engine is told are ranges of the file: the tables it reads from
        # it, and the constants copied at init that nothing reads in place (flag 1: their
        # pages may be dropped as they are copied; a large weight is reordered in chunks)
        flags = dict.fromkeys(self.file_read, 0)
        for op in ops:
            for tid in op["in"][1:] if op["kind"] in COPIED_AT_INIT else ():
                root = roots[tid]
                pages = spans.get(root, (0, 0, None))[2]
                if pages is not None and pages.fd is not None and borrowed.get(root) and \
                        root not in self.in_place:
                    flags[root] = 1
        self.file_sources: list[tuple[int, int, int, int]] = [
            (root, spans[root][2].fd, spans[root][0] - spans[root][2].start, flag)
            for root, flag in flags.items()]

    def give_back(self, op: dict) -> None:
        """The file's pages of the constants ``op`` copied at init, and of a table it reads
        from the file, unless an op reads them in place."""
        roots = self.roots
        tables = [t for t in op["in"][:1] if roots[t] in self.file_read] \
            if op["kind"] == "embedding" else []
        for tid in tables + (op["in"][1:] if op["kind"] in COPIED_AT_INIT else []):
            address, nbytes, release = self.spans.get(roots[tid], (0, 0, None))
            if release is not None and nbytes and roots[tid] not in self.in_place:
                release(address, nbytes)
