"""The result store: Parquet part files under a hash of what defines the results, written atomically.

Layout (marin-style: results live under the hash of their definition, so a re-run finds and resumes them):

    <output_dir>/<sweep_id>/manifest.json                       what defines the sweep (the hashed mapping)
    <output_dir>/<sweep_id>/generation=<g>/workload=<w>/part-<batch key>.parquet

A part file appears only complete: it is written to a temporary name in the same directory and ``os.replace``d
into place, so an interrupted sweep leaves either a whole part or none, and a re-run skips the parts that exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SORT_KEYS = ("design_id", "workload", "scenario", "mapping", "concurrency")


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr)


def definition_hash(definition: dict, length: int = 16) -> str:
    """Stable hash of a JSON-able mapping: keys sorted, floats by repr (so 1e15 and 1.0e+15 agree)."""
    return hashlib.sha256(canonical_json(definition).encode()).hexdigest()[:length]


def source_fingerprint(*package_dirs: Path, length: int = 16) -> str:
    """Hash of the Python sources under ``package_dirs`` (relative paths and contents; caches and bytecode
    ignored). In a sweep's definition it makes a change to the code that computes the rows a new sweep, so a
    re-run never resumes rows an older model computed (a forgotten version bump cannot leak them into a study)."""
    h = hashlib.sha256()
    for root in package_dirs:
        root = Path(root)
        for f in sorted(root.rglob("*.py")):
            if "__pycache__" in f.parts:
                continue
            h.update(f"{root.name}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:length]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_table(table: pa.Table, path: Path) -> None:
    sink = pa.BufferOutputStream()
    # dictionary-encode the string columns only: ids and labels repeat, floats rarely do (encoding them costs
    # 3x the write time of a result part for a few % of size)
    strings = [f.name for f in table.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    pq.write_table(table, sink, compression="zstd", use_dictionary=strings or False)
    atomic_write_bytes(Path(path), sink.getvalue().to_pybytes())


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(Path(path), text.encode())


class ResultStore:
    def __init__(self, output_dir: str | os.PathLike, definition: dict):
        self.definition = definition
        self.sweep_id = definition_hash(definition)
        self.root = Path(output_dir) / self.sweep_id

    def open(self) -> "ResultStore":
        manifest = self.root / "manifest.json"
        if not manifest.exists():
            atomic_write_text(manifest, json.dumps(self.definition, sort_keys=True, indent=1, default=repr))
        return self

    def part_path(self, generation: str, workload: str, key: str) -> Path:
        return self.root / f"generation={generation}" / f"workload={workload}" / f"part-{key}.parquet"

    def has(self, generation: str, workload: str, key: str) -> bool:
        return self.part_path(generation, workload, key).exists()

    def write(self, generation: str, workload: str, key: str, table: pa.Table) -> Path:
        path = self.part_path(generation, workload, key)
        atomic_write_table(table, path)
        return path

    def parts(self) -> list[Path]:
        return sorted(self.root.glob("generation=*/workload=*/part-*.parquet"))

    def read(self) -> pa.Table:
        """Every part, concatenated and sorted on the row key (deterministic whatever the completion order)."""
        parts = self.parts()
        if not parts:
            raise FileNotFoundError(f"no result parts under {self.root}")
        table = pa.concat_tables([pq.read_table(p) for p in parts], promote_options="default")
        return table.sort_by([(k, "ascending") for k in SORT_KEYS if k in table.column_names])
