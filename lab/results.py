"""The one tidy results table, per device: `results/<device>/results.csv` (lab.env.device_dir); every benchmark appends
rows, plots are drawn from it. A row goes to the folder of the device it was measured on, so a run on one machine
never touches another's rows; reading without a path reads every device's table (rows carry device_name).

Writes are atomic: the new table is written to a temporary file and renamed over the old one, under a lock, so an
interrupted run leaves either the old table or the new one, never half a row.
"""
from __future__ import annotations

import csv
import fcntl
import functools
import io
import json
import os
import time
import uuid
from pathlib import Path

from . import env

COLUMNS = [
    "family", "op", "version", "shape", "size", "dtype", "precision", "device", "device_name", "mode",
    "median_us", "p20_us", "p80_us", "reps", "gbps", "tflops", "pct_copy_bw", "pct_peak", "baseline", "speedup",
    "torch", "cuda", "commit", "timestamp", "run_id", "note",
    # a GPU repetition's two parts (lab/timing.py: median_us is the larger of them per repetition): the GPU's time
    # (CUDA events) and the host's time to issue the call, medians over the repetitions; empty for CPU rows, the extras'
    # rows and rows recorded before the columns were added (rows before de761d0 were timed by the GPU's part alone)
    "gpu_us", "host_us",
]
NUMERIC = {"size", "median_us", "p20_us", "p80_us", "reps", "gbps", "tflops", "pct_copy_bw", "pct_peak", "speedup",
           "gpu_us", "host_us"}
RUN_ID = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]  # one per process: rows of one run group


TABLE = "results.csv"


def table_path(device_name: str | None = None, name: str = TABLE) -> Path:
    """results/<device>/<name> (default: this machine's default device)."""
    return (env.device_dir(device_name) if device_name else env.results_dir()) / name


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def append(rows: list[dict], path: Path | None = None, columns: list[str] | None = None, name: str = TABLE) -> Path:
    """Append rows (dicts keyed by COLUMNS; missing keys stay empty, unknown keys are an error). Without a path,
    each row goes to results/<its device_name>/<name>; returns the (last) path written."""
    if path is None:
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r.get("device_name") or env.device_name(env.default_device()), []).append(r)
        out = table_path(name=name)
        for dev, rs in groups.items():
            out = append(rs, table_path(dev, name), columns)
        return out
    cols = columns or COLUMNS
    path.parent.mkdir(parents=True, exist_ok=True)
    upgrade_header(path, cols)
    for r in rows:
        extra = set(r) - set(cols)
        if extra:
            raise ValueError(f"unknown result columns {sorted(extra)}; columns are {cols}")
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = path.read_text() if path.exists() else ""
        buf = io.StringIO()
        w = csv.DictWriter(buf, cols, lineterminator="\n")
        if not old:
            w.writeheader()
        elif not old.endswith("\n"):
            old += "\n"
        for r in rows:
            w.writerow({k: _fmt(r.get(k)) for k in cols})
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(old + buf.getvalue())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return path


def upgrade_header(path: Path, cols: list[str]) -> None:
    """A table written before columns were added (its header a prefix of `cols`) is rewritten under today's header,
    its rows' new cells empty; any other header is an error (appending under it would shift every cell). append()
    calls it; .ci/merge_results.py too, before it appends a newer run's rows."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    if not header or header == cols:
        return
    if header != cols[:len(header)]:
        raise ValueError(f"{path}: its header {header} is not a prefix of the columns written now {cols}: "
                         "move the file aside (or merge it with .ci/merge_results.py) rather than append to it")
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        buf = io.StringIO()
        w = csv.DictWriter(buf, cols, lineterminator="\n", restval="")
        w.writeheader()
        w.writerows(rows)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(buf.getvalue())
        os.replace(tmp, path)


RENAMES = Path(__file__).with_name("renames.json")


@functools.cache
def _renames() -> tuple[str, dict]:
    d = json.loads(RENAMES.read_text())
    return d["renamed_at"], {(r["family"], r["op"], r["version"], r["dtype"]): (r["new_op"], r["new_version"])
                             for r in d["renames"]}


def current_names(row: dict) -> dict:
    """A row recorded before lab/renames.json's renamed_at, in today's vocabulary (op, version, and the baseline
    column's name); a newer row unchanged. The CSVs keep what was recorded; read() applies this on the way in."""
    before, table = _renames()
    if not row.get("family") or (row.get("timestamp") or "") >= before:
        return row
    row = dict(row)
    new = table.get((row["family"], row.get("op"), row.get("version"), row.get("dtype")))
    base = row.get("baseline")
    if base:
        name, sep, mode = base.partition(" (")
        b = table.get((row["family"], row.get("op"), name, row.get("dtype")))
        if b:
            row["baseline"] = b[1] + sep + mode
    if new:
        row["op"], row["version"] = new
    return row


def read(path: Path | None = None, numeric: set[str] | None = None, name: str = TABLE, **where) -> list[dict]:
    """Rows as dicts (numbers as floats, empty as None), in today's vocabulary (current_names), optionally filtered:
    read(family='basics', device='cuda'). Without a path: every device's results/<device>/<name>."""
    if path is None:
        return [r for d in env.device_dirs() for r in read(d / name, numeric, **where)]
    if not path.exists():
        return []
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row = {}
            for k, v in r.items():
                if k in (NUMERIC if numeric is None else numeric):
                    row[k] = float(v) if v not in ("", None) else None
                else:
                    row[k] = v if v != "" else None
            row = current_names(row)
            if all(str(row.get(k)) == str(v) for k, v in where.items()):
                out.append(row)
    return out


def latest(rows: list[dict]) -> list[dict]:
    """Keep the newest row for each (family, op, version, shape, dtype, device_name, mode)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        k = (r["family"], r["op"], r["version"], r["shape"], r["dtype"], r["device_name"], r["mode"])
        if k not in best or (r["timestamp"] or "") >= (best[k]["timestamp"] or ""):
            best[k] = r
    return list(best.values())


def family_rows(family: str, device_name: str | None = None) -> list[dict]:
    """The newest rows (latest) of one family on one device: `device_name`, else the device of the newest CUDA row,
    else of the newest row. What a notebook prints where it cannot measure (no GPU): the recorded GPU run."""
    rows = latest(read(family=family))
    if not rows:
        return []
    if not device_name:
        pool = [r for r in rows if r.get("device") == "cuda"] or rows
        device_name = max(pool, key=lambda r: r["timestamp"] or "")["device_name"]
    return [r for r in rows if r["device_name"] == device_name]


def latest_checks(rows: list[dict]) -> list[dict]:
    """Keep the newest check of each (family, op, version, dtype, shape, device) from checks.csv rows."""
    best: dict[tuple, dict] = {}
    for c in rows:
        k = (c["family"], c["op"], c["version"], c["dtype"], c["shape"], c["device"])
        if k not in best or (c["timestamp"] or "") >= (best[k]["timestamp"] or ""):
            best[k] = c
    return list(best.values())


def stamp(device) -> dict:
    m = env.machine(str(device))
    return {"device": m["device"], "device_name": m["device_name"], "torch": m["torch"], "cuda": m["cuda"],
            "commit": m["commit"], "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "run_id": RUN_ID}
