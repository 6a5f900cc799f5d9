"""The run's folder is the run's own: one run per `output_dir`, and room for its saves.

Two runs writing one folder destroy each other: each deletes the other's `.tmp*` files as an interrupted save's,
and `save_total_limit` the other's checkpoints. So from before its first write there to its end, a run takes `<output_dir>/.hf-mocose-run.lock` (`filelock`'s OS
lock: the kernel releases it when its process dies, however it dies) and writes who it is beside it,
`.hf-mocose-run.json` (pid, host, start), since the OS lock does not say who holds it. A second run is refused naming
the first; a run that finds the record of one that died without releasing says in one line that it takes over.
Under several processes, rank 0 takes the lock and the others learn its answer. A process may take the lock of a
folder again (the driver holds it around `MoCoSETrainer.train`, which takes it too): it is released with the last.
The folders the lock made are removed at the release when the lock is all they hold: a run refused before its
first write (an unknown model id, say) leaves nothing behind.

A save that cannot be written (a full disk, a quota, an I/O error: the writer's `OSError`, `SafetensorError` or
torch's `RuntimeError`) ends the run in one line (`failed_save_sentence`): the file, the space the save needs (the
last complete checkpoint's size, else the state's tensor bytes) and the space free, and the checkpoint to resume
from; the incomplete folder stays, and `--resume_from_checkpoint last` skips it as any other. `check_room_for_a_save`
refuses before the first step a run whose checkpoint cannot fit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout
from safetensors import SafetensorError

from .checkpoints import checkpoint_step, newest_complete_checkpoint

logger = logging.getLogger(__name__)

LOCK_FILE = ".hf-mocose-run.lock"
OWNER_FILE = ".hf-mocose-run.json"
OWNER_WAIT_S = 2.0  # the holder writes its record just after taking the OS lock
_held: dict[Path, list] = {}  # lock file -> [FileLock, times taken by this process, the folders the take made]


def _owner(folder: Path) -> dict | None:
    try:
        return json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _describe(owner: dict | None) -> str:
    if not owner:
        return "a run that has not said who it is yet"
    return f"pid {owner.get('pid')} on {owner.get('host')}, running since {owner.get('since')}"


def _take(output_dir: str) -> None:
    folder = Path(output_dir).absolute()
    path = folder / LOCK_FILE
    if path in _held:
        _held[path][1] += 1
        return
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        deadline = time.monotonic() + OWNER_WAIT_S
        while (owner := _owner(folder)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        raise ValueError(f"output_dir {output_dir!r} is in use by another run ({_describe(owner)}): two runs in one "
                         "folder delete each other's checkpoints. Wait for it to end, or give another "
                         "--output_dir.") from None
    if (previous := _owner(folder)) is not None:  # we hold the OS lock, so its holder is gone
        logger.warning("output_dir %s: taking over the lock of a run that ended without releasing it (%s).",
                       output_dir, _describe(previous))
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    partial = folder / f"{OWNER_FILE}.{os.getpid()}"  # not `.tmp*`, which is an interrupted save's
    partial.write_text(json.dumps(record), encoding="utf-8")
    os.replace(partial, folder / OWNER_FILE)
    _held[path] = [lock, 1, made]


def _rank_zero_answer(take) -> None:
    """Runs `take` on rank 0 (alone: here) and raises its refusal on every process (without a process group
    yet, each rank other than 0 goes on: only rank 0 writes the folder)."""
    import torch.distributed as dist

    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank = dist.get_rank() if several else int(os.environ.get("RANK", "0"))  # no process group: the launcher's rank
    answer = [None]
    if rank == 0:
        try:
            take()
        except ValueError as err:
            if not several:
                raise
            answer = [str(err)]
    if several:
        dist.broadcast_object_list(answer, src=0)
    if answer[0] is not None:
        raise ValueError(answer[0])


def lock_run_folder(output_dir: str) -> None:
    """Takes `output_dir` for this run (rank 0; every process of a launch calls it): refuses, in one line naming
    the other run, a folder another live run holds. Pair with `release_run_folder`."""
    _rank_zero_answer(lambda: _take(output_dir))


def release_run_folder(output_dir: str) -> None:
    """Gives back what `lock_run_folder` took (at the last of this process's takes), removing the record."""
    path = Path(output_dir).absolute() / LOCK_FILE
    if (held := _held.get(path)) is None:
        return
    held[1] -= 1
    if held[1] == 0:
        del _held[path]
        (path.parent / OWNER_FILE).unlink(missing_ok=True)
        if held[2] and [entry.name for entry in path.parent.iterdir()] == [LOCK_FILE]:
            with suppress(OSError):  # still holding the OS lock: no other run has taken the folder meanwhile
                path.unlink()
                for made in held[2]:
                    made.rmdir()  # one that is not empty (something else was written there) stops it
        held[0].release()


def holds_run_folder(output_dir: str) -> bool:
    """Whether this process holds the lock of `output_dir`."""
    return Path(output_dir).absolute() / LOCK_FILE in _held


class SaveFailedError(OSError):
    """A save that could not be written (full disk, quota, I/O error), said in one line (`failed_save_sentence`)."""


# torch.save reports a failed write as a RuntimeError: these words tell it from any other RuntimeError.
_TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "No space left", "Disk quota")


def folder_bytes(folder: str | os.PathLike) -> int:
    """Bytes of the files under `folder`."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes free on the file system of `path` (or of its nearest existing parent)."""
    existing = next(p for p in (Path(path).absolute(), *Path(path).absolute().parents) if p.exists())
    return shutil.disk_usage(existing).free


def tensor_bytes(*modules, optimizer_moments: int = 0) -> int:
    """Bytes of the tensors of `modules` (`nn.Module`s), plus `optimizer_moments` fp32 copies of their trainable
    parameters (AdamW keeps 2): the size of a save while no checkpoint of the run shows it."""
    return sum(sum(t.numel() * t.element_size() for t in module.state_dict().values())
               + optimizer_moments * 4 * sum(p.numel() for p in module.parameters() if p.requires_grad)
               for module in modules)


def size_of_a_save(output_dir: str | os.PathLike, tensor_bytes: int) -> int:
    """Bytes one checkpoint of this run takes: the newest complete one's size, else `tensor_bytes` (the state's)."""
    newest = newest_complete_checkpoint(output_dir)
    return folder_bytes(newest) if newest is not None else tensor_bytes


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def check_room_for_a_save(output_dir: str | os.PathLike, tensor_bytes: int) -> None:
    """Refuses a run whose checkpoint (`size_of_a_save`) does not fit in the free space of `output_dir`."""
    needed, free = size_of_a_save(output_dir, tensor_bytes), free_bytes(output_dir)
    if needed > free:
        raise ValueError(f"output_dir {str(output_dir)!r} has {_megabytes(free)} free, and a checkpoint of this run "
                         f"takes about {_megabytes(needed)}: the first save would fail. Free space there, or give an "
                         "--output_dir on a disk with room.")


@contextmanager
def failed_save_sentence(folder: str | os.PathLike, output_dir: str | os.PathLike, tensor_bytes: int,
                         advice: str | None = None, written_in: str | os.PathLike | None = None):
    """Turns a write failure while saving `folder` into a one-line `SaveFailedError` (the module docstring).
    `tensor_bytes`: the state's size, the estimate while no checkpoint of `output_dir` is complete; for a folder that
    is not a checkpoint (the final model, an export), the save's own size. `advice`: what to do instead of resuming
    from a checkpoint (an export names the model it exports). `written_in`: the folder the files are written to
    when it is not `folder` (an export's staging folder), named in the line as their place in `folder`."""
    try:
        yield
    except (OSError, SafetensorError, RuntimeError) as err:
        if isinstance(err, RuntimeError) and not any(words in str(err) for words in _TORCH_WRITE_FAILURES):
            raise
        if isinstance(err, SaveFailedError):
            raise
        folder, written_in = Path(folder), Path(written_in or folder)
        written = [p for p in written_in.rglob("*") if p.is_file()] if written_in.is_dir() else []
        file = Path(getattr(err, "filename", None) or max(written, key=lambda p: p.stat().st_mtime_ns, default=folder))
        if file.is_relative_to(written_in):
            file = folder / file.relative_to(written_in)
        why = getattr(err, "strerror", None) or " ".join(str(err).split())[:200]
        checkpoint = checkpoint_step(folder) is not None
        if advice is not None:
            resume = advice
        elif (last := newest_complete_checkpoint(output_dir)) is None:
            resume = f"no complete checkpoint in {output_dir} to resume from: free space and train again"
        elif not checkpoint:  # the final model: training is over
            resume = (f"the newest complete checkpoint is {last}: free space, then export it with hf-mocose export "
                      f"{last} FOLDER, or train again")
        else:
            resume = (f"the last complete checkpoint is {last}: free space, then resume with --resume_from_checkpoint "
                      f"last (it skips the incomplete {folder.name})")
        needed = size_of_a_save(output_dir, tensor_bytes) if checkpoint else tensor_bytes
        raise SaveFailedError(f"Saving {folder} failed writing {file} ({why}): the save needs about "
                              f"{_megabytes(needed)} and {_megabytes(free_bytes(folder))} is free; {resume}.") from None
