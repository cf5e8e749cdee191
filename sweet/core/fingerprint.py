"""What defines a run, recorded in its output_dir, so that a resume cannot mix two runs.

    finished = begin_run(output_dir, {"model": model_cfg, "train": train, "rft": cfg}, resume=train.resume)

Every trainer (critic, the policy algorithms, LOOP) calls `begin_run` first, on every
process, before any work. The fingerprint (output_dir/fingerprint.json) is every config
field except pure bookkeeping (BOOKKEEPING: where outputs go, how often to log or save,
batching that does not change the update), with data files replaced by their content
hash (episodes, tasks: a renamed copy is the same data; `builtin:`/`hf:` sources stay
names), the model spec by its resolved path and its config.json hash, and every prompt
template file (--agent_prompt, --human_prompt, --critic_context_prompt; our default when
unset) by its path and sha256 (sweet.core.config.prompt_files).

- resume, fingerprint recorded and equal: go on (returns the finished marker when the
  run is finished: nothing to do);
- resume, fingerprint different: stop with one line naming each differing field
  (`train.learning_rate: 2e-06 -> 0.01`) and how to start fresh;
- a field renamed since (its earlier name kept as an alias, colbench.cli.aliases) is
  compared under its new name: a run recorded before the rename resumes;
- a field added since, with a number, flag or None as its default, is recorded as that
  default for a run that predates it (the value the run had): it resumes when the field is
  left at its default;
- a fresh start (`--resume false`, or a folder holding an earlier run without a
  fingerprint): the earlier run's files are moved to output_dir/previous-<timestamp>/,
  never deleted or truncated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from colbench.cli import aliases
from colbench.io import atomic_write
from engines import model_path
from sweet.core.config import PROMPT_FIELDS, prompt_files, resolve_defaults, to_jsonable
from sweet.core.trainer import finished, process_state

FINGERPRINT_FILE = "fingerprint.json"
# fields that change where results go or how often they are logged, never the result
# (micro_batch_size: the update is invariant to it, tests/sweet/test_policy_invariance.py;
# stage: sweet's sample/train split of one run)
BOOKKEEPING = frozenset({"output_dir", "logging_steps", "report_to", "save_steps", "resume", "eval_batch_size",
                         "micro_batch_size", "stage", "snapshot_steps"})
DATA_FIELDS = frozenset({"episodes", "eval_episodes", "tasks", "critic", "reuse_candidates"})  # comma lists allowed
RUN_MARKERS = ("config.json", "metrics.jsonl", FINGERPRINT_FILE, "finished.json", "final")
PREVIOUS_PREFIX = "previous-"
KEEP_IN_PLACE = (".lock",)  # the folder's lock (colbench.outdir), held by the run that moves the rest aside


class RunMismatch(ValueError):
    """The output_dir holds another run (one line: what differs and how to start fresh)."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _data_entry(value: str) -> Any:
    """A data source: a local file by content hash, a folder (a critic) by the hashes of
    its small descriptive files, anything else (builtin:, hf:, oracle) by name."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    out = []
    for part in parts:
        path = Path(part)
        if path.is_file():
            out.append({"path": str(path.resolve()), "sha256": file_sha256(path)})
        elif path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
            digest = hashlib.sha256(b"".join(p.name.encode() + file_sha256(p).encode() for p in files)).hexdigest()
            out.append({"path": str(path.resolve()), "sha256": digest})
        else:
            out.append(part)
    return out[0] if len(out) == 1 else out


def _model_entry(spec: str) -> Any:
    """The model spec, its resolved path and its config.json hash (a local model)."""

    try:
        path = Path(model_path(spec))
    except Exception:  # a spec the trainer itself will refuse with its own message
        return spec
    config = path / "config.json"
    if not config.is_file():
        return spec  # a hub id: its name is all we know without downloading
    return {"path": str(path.resolve()), "sha256": file_sha256(config)}


def run_fingerprint(configs: dict[str, Any]) -> dict[str, Any]:
    """`section.field` -> value for every result-defining field of `configs` (cross-config
    defaults resolved first: a learning rate left to its --lora default is its value)."""
    resolve_defaults(list(configs.values()))
    fp: dict[str, Any] = {}
    for section, cfg in configs.items():
        data = to_jsonable(cfg)
        if not isinstance(data, dict):
            fp[section] = data
            continue
        for name, value in data.items():
            if name in BOOKKEEPING or name in PROMPT_FIELDS:  # prompt files: below, by content
                continue
            if isinstance(value, str) and value and name in DATA_FIELDS:
                value = _data_entry(value)
            elif isinstance(value, str) and name == "model":
                value = _model_entry(value)
            fp[f"{section}.{name}"] = value
    for key, rec in prompt_files(configs).items():  # prompt files by content, our defaults too
        fp[key] = {"path": rec["path"], "sha256": rec["sha256"], "default": rec["default"]}
    return fp


def _key(value: Any) -> Any:
    """What is compared: a file's content, not where it lies."""
    if isinstance(value, dict) and "sha256" in value:
        return value["sha256"]
    if isinstance(value, list):
        return [_key(v) for v in value]
    return value


def _show(value: Any) -> str:
    if isinstance(value, dict) and "sha256" in value:
        return f"{value['path']} (sha256 {value['sha256'][:12]})"
    if isinstance(value, list):
        return ",".join(_show(v) for v in value)
    return json.dumps(value)


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old -> new` for every field whose value differs. A prompt field a fingerprint
    from before prompt files were recorded lacks is equal when it is our default file."""
    def same(k: str) -> bool:
        if k not in old and isinstance(new.get(k), dict) and new[k].get("default"):
            return True
        return _key(old.get(k)) == _key(new.get(k))

    return [f"{k}: {_show(old.get(k))} -> {_show(new.get(k))}" for k in sorted(set(old) | set(new)) if not same(k)]


WORK_MARKERS = ("finished.json", "final", "candidates.jsonl", "baseline_samples.jsonl")  # with checkpoint-* and logged metrics


def holds_work(out: Path) -> bool:
    """Whether `out` holds anything a run computed (checkpoints, metrics rows, a final model,
    stage-2 candidates), not just the settings an attempt wrote before failing."""
    metrics = out / "metrics.jsonl"
    return (any((out / m).exists() for m in WORK_MARKERS) or any(out.glob("checkpoint-*"))
            or (metrics.exists() and metrics.stat().st_size > 0))


def holds_run(out: Path) -> bool:
    return out.is_dir() and (any((out / m).exists() for m in RUN_MARKERS) or any(out.glob("checkpoint-*")))


def move_aside(out: Path, keep: set[Path]) -> Path:
    """Move every entry of `out` (but earlier previous-* folders and `keep`, the inputs
    this run reads from inside it) into out/previous-<timestamp>/; returns that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = out / f"{PREVIOUS_PREFIX}{stamp}", 1
    while dest.exists():
        dest, n = out / f"{PREVIOUS_PREFIX}{stamp}-{n}", n + 1
    dest.mkdir()
    for entry in sorted(out.iterdir()):
        resolved = entry.resolve()
        kept = entry.name in KEEP_IN_PLACE or entry.name.startswith(PREVIOUS_PREFIX)
        if entry == dest or kept or any(k == resolved or resolved in k.parents for k in keep):
            continue
        entry.rename(dest / entry.name)
    return dest


def _inputs(fp: dict[str, Any]) -> set[Path]:
    found: set[Path] = set()

    def walk(v: Any) -> None:
        if isinstance(v, dict) and "path" in v:
            found.add(Path(v["path"]))
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for v in fp.values():
        walk(v)
    return found


def renamed_fields(old: dict[str, Any], configs: dict[str, Any]) -> dict[str, Any]:
    """A recorded fingerprint in today's fields: each `section.<alias>` key under the field's
    name today, and each field added since (a number, flag or None by default) at its default."""
    out = dict(old)
    for section, cfg in configs.items():
        if dataclasses.is_dataclass(cfg):
            for alias, name in aliases(type(cfg)).items():
                if f"{section}.{alias}" in out and f"{section}.{name}" not in out:
                    out[f"{section}.{name}"] = out.pop(f"{section}.{alias}")
            if any(k.startswith(f"{section}.") for k in old):  # a section the old run recorded
                for f in dataclasses.fields(cfg):
                    scalar = f.default is None or isinstance(f.default, (bool, int, float))
                    if f.name not in BOOKKEEPING and scalar and f"{section}.{f.name}" not in out:
                        out[f"{section}.{f.name}"] = f.default
    return out


def begin_run(output_dir: str | Path, configs: dict[str, Any], *, resume: bool,
              keep: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Check `output_dir` against this run (module docstring); every process calls it.
    Returns the finished marker of this same run when it is finished, else None.
    `keep`: names in output_dir a fresh start leaves in place (caches that check their
    own settings, e.g. stage 2's candidates)."""

    out = Path(output_dir)
    fp = run_fingerprint(configs)
    path = out / FINGERPRINT_FILE
    old = None
    if resume and path.exists():
        try:
            old = renamed_fields(json.loads(path.read_text()), configs)
        except ValueError:
            old = None  # torn: treated as an earlier run of unknown settings (moved aside)
    replace = False
    if old is not None:
        diff = differences(old, fp)
        if diff and not holds_work(out):
            # an earlier attempt stopped before any work (a bad flag or file): nothing to mix
            old, replace = None, True
        elif diff:
            raise RunMismatch(f"{out} holds another run ({'; '.join(diff)}): rerun with its settings to resume it, "
                              "or start fresh with a new --output_dir or --resume false (the old run is moved aside)")
    fresh = old is None and not replace and holds_run(out)
    state = process_state()
    state.wait_for_everyone()  # every process has decided before the folder changes
    if state.is_main_process:
        if fresh:
            keep_paths = _inputs(fp) | {(out / k).resolve() for k in keep}
            dest = move_aside(out, keep_paths)
            print(f"{out} held an earlier run: moved it to {dest} (a fresh start)")
        out.mkdir(parents=True, exist_ok=True)
        if old is None:
            atomic_write(path, json.dumps(fp, indent=2))
    state.wait_for_everyone()
    return finished(out) if old is not None else None

