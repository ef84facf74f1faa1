# SPDX-License-Identifier: Apache-2.0
"""psched.export: read a folder that `psched export` wrote (actors/shard/model_export.h has its
layout; docs/embeddings.md, "Export and serve").

    folder = psched.export.load("model-export")
    folder.step, folder.dense_names(), folder.table_names()
    w = folder.dense("bottom.0.weight")          # numpy array, memory-mapped
    ids, values = folder.rows("table0")          # the stored rows, memory-mapped
    table = folder.table("table0")               # every row, initial ones computed: (n, dim)

The files are numpy .npy files and a JSON manifest, so numpy alone reads them
(numpy.load(path, mmap_mode="r")); this module adds the checks and the rows a table never stored,
which hold their initial value, computed by the shards' own function (psched._core.initial_rows,
actors/shard/row_init.h), so that a table built here is bit for bit the one the shards held.
"""
import json
import os

import numpy as np

from . import _core
from .errors import Error

FORMAT = "psched-export"
VERSION = 1  # the layout this reader knows (model_export.h's kExportVersion)
_TABLE_CHUNK = 1 << 20  # rows computed at a time when building a whole table


class ExportFolder:
    """An export folder, its manifest read and checked (format and version); the arrays are
    opened when asked for, memory-mapped."""

    def __init__(self, path):
        self.path = os.fspath(path)
        manifest = os.path.join(self.path, "manifest.json")
        try:
            with open(manifest) as source:
                self.manifest = json.load(source)
        except FileNotFoundError:
            raise Error(f"{self.path} is no psched export: it has no manifest.json (write one "
                        "with `psched export --from CHECKPOINTS --to FOLDER`)",
                        "invalid_argument") from None
        except json.JSONDecodeError as error:
            raise Error(f"{manifest} is not JSON: {error}", "invalid_argument") from None
        found = (self.manifest.get("format"), self.manifest.get("version"))
        if found != (FORMAT, VERSION):
            raise Error(f"{manifest} is format {found[0]!r} version {found[1]!r}; this psched "
                        f"reads {FORMAT!r} version {VERSION}", "invalid_argument")
        self._dense = {entry["name"]: entry for entry in self.manifest["dense"]}
        self._buffers = {entry["name"]: entry for entry in self.manifest.get("buffers", [])}
        self._tables = {entry["name"]: entry for entry in self.manifest["tables"]}

    @property
    def step(self):
        """The job's step the export holds (its newest complete one)."""
        return self.manifest["step"]

    def dense_names(self):
        return list(self._dense)

    def buffer_names(self):
        """The module state a trainer added (psched.torch.export): buffers and frozen
        parameters, which the shards never held."""
        return list(self._buffers)

    def table_names(self):
        return list(self._tables)

    def dense_entry(self, name):
        return self._entry(self._dense, name, "dense variable")

    def table_entry(self, name):
        return self._entry(self._tables, name, "table")

    def dense(self, name):
        """Dense variable `name`'s value, in its shape and dtype (memory-mapped, read-only)."""
        return self._load(self.dense_entry(name)["file"])

    def buffer(self, name):
        """Module state `name` that a trainer added (memory-mapped, read-only)."""
        return self._load(self._entry(self._buffers, name, "buffer")["file"])

    def rows(self, name):
        """(ids, values): the rows table `name` stored, in storage order (memory-mapped)."""
        entry = self.table_entry(name)
        return self._load(entry["ids"]), self._load(entry["values"])

    def initial_rows(self, name, ids):
        """The initial values of rows `ids` (1-D integer array) of table `name`, as the shards
        compute them from the table's init and seed."""
        entry = self.table_entry(name)
        init = entry["init"]
        init = (init["kind"],) if init["kind"] == "zeros" else (init["kind"], init["a"], init["b"])
        return _core.initial_rows(np.ascontiguousarray(ids), entry["dim"], entry["dtype"], init,
                                  entry["seed"])

    def table(self, name, out=None):
        """Every row of table `name`, (num_embeddings, dim) in its dtype: the stored rows where
        stored, the initial value elsewhere. `out`: an array of that shape and dtype to fill
        instead of a new one (a torch tensor's .numpy(), say). Holds the whole table in
        memory; the files themselves are read a chunk at a time."""
        entry = self.table_entry(name)
        shape, dtype = (entry["num_embeddings"], entry["dim"]), np.dtype(entry["dtype"])
        if out is None:
            out = np.empty(shape, dtype)
        elif out.shape != shape or out.dtype != dtype:
            raise Error(f"table '{name}' is {shape} {dtype}; the array given is {out.shape} "
                        f"{out.dtype}", "shape_mismatch")
        for start in range(0, shape[0], _TABLE_CHUNK):
            ids = np.arange(start, min(start + _TABLE_CHUNK, shape[0]), dtype=np.uint64)
            out[start:start + len(ids)] = self.initial_rows(name, ids)
        ids, values = self.rows(name)
        for start in range(0, len(ids), _TABLE_CHUNK):
            out[ids[start:start + _TABLE_CHUNK]] = values[start:start + _TABLE_CHUNK]
        return out

    def _entry(self, entries, name, kind):
        if name not in entries:
            have = ", ".join(sorted(entries)) or "none"
            raise Error(f"{self.path} holds no {kind} '{name}' (it holds: {have})",
                        "invalid_argument")
        return entries[name]

    def _load(self, relative):
        return np.load(os.path.join(self.path, relative), mmap_mode="r")


def load(path):
    """The export folder at `path` (ExportFolder); raises psched.Error when it is none or of a
    format this psched does not read."""
    return ExportFolder(path)
