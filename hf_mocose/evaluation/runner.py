"""Runs a set of SentEval tasks on one encoder and formats the results as the papers do.

The encoder (`load_encoder`) is a MoCoSE checkpoint, a sentence-transformers folder or a plain HF encoder, each
loaded as a `SentenceTransformer` (a plain encoder as `Transformer` + `Pooling` (+ `Dense`)) and encoded with its
`encode`. Task names (command line and JSON keys):

* STS test sets: ``sts12 sts13 sts14 sts15 sts16 stsb sickr`` (the papers' seven; ``avg`` is their mean);
* STS extras: ``stsb_dev`` (in the default set) and ``stsb_train sickr_trial sickr_train`` (only when asked);
* transfer: ``mr cr subj mpqa sst2 trec mrpc``;
* groups: ``sts`` (the 7 test sets + stsb_dev; the default), ``transfer``, ``all`` (both).

The transfer tasks train classifiers (SST-2 alone takes minutes on a CPU), so they run only when asked for.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_mocose.data.sts_files import LAYOUT_HELP
from hf_mocose.evaluation.sts import STS_TASKS, STS_TEST_TASKS, evaluate_sts_task, load_sts_task, sts_task_files
from hf_mocose.evaluation.transfer import (DEFAULT_SEED, TRANSFER_LAYOUT_HELP, TRANSFER_TASKS, evaluate_transfer_task,
                                           transfer_task_files)
from hf_mocose.models.encoding import resolve_max_length
from hf_mocose.models.pooling import check_sentence_pooling

ALL_TASKS = STS_TASKS + TRANSFER_TASKS
TASK_GROUPS = {"sts": STS_TEST_TASKS + ("stsb_dev",), "transfer": TRANSFER_TASKS,
               "all": STS_TEST_TASKS + ("stsb_dev",) + TRANSFER_TASKS}
DEFAULT_GROUP = "sts"
DISPLAY_NAMES = {
    "sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
    "stsb": "STS-B", "sickr": "SICK-R", "stsb_dev": "STS-B dev", "stsb_train": "STS-B train",
    "sickr_trial": "SICK-R trial", "sickr_train": "SICK-R train",
    "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA", "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC",
}  # fmt: skip


def missing_files(senteval_dir: str | Path, task: str) -> list[Path]:
    files = sts_task_files(senteval_dir, task) if task in STS_TASKS else transfer_task_files(senteval_dir, task)
    return [path for path in files if not path.is_file()]


def resolve_tasks(senteval_dir: str | Path, requested: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The tasks to run and the ones skipped for missing files (``{task: first missing path}``): `requested`
    None means the default group's; a task named on its own (not through a group) must have all its files."""
    root = Path(senteval_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"SentEval directory {root} does not exist; {LAYOUT_HELP}; {TRANSFER_LAYOUT_HELP}")
    requested = None if requested is None else [name.lower() for name in requested]
    names: list[str] = []
    for name in requested or [DEFAULT_GROUP]:
        if name in TASK_GROUPS:
            names.extend(TASK_GROUPS[name])
        elif name in ALL_TASKS:
            names.append(name)
        else:
            raise ValueError(f"unknown task {name!r}; valid task names: {', '.join((*ALL_TASKS, *TASK_GROUPS))}")
    run, skipped = [], {}
    for name in dict.fromkeys(names):  # dedupe, keep order
        if not (missing := missing_files(root, name)):
            run.append(name)
        elif requested and name in requested:  # named on its own, not through a group
            help_text = LAYOUT_HELP if name in STS_TASKS else TRANSFER_LAYOUT_HELP
            raise FileNotFoundError(f"task {name}: missing file {missing[0]}; {help_text}")
        else:  # a group member or a default task: skip it and say so
            skipped[name] = str(missing[0])
    if not run:
        raise FileNotFoundError(f"no task has its files under {root} (skipped: {', '.join(skipped)}); {LAYOUT_HELP}; "
                                f"{TRANSFER_LAYOUT_HELP}")
    return run, skipped


def run_tasks(encoder, senteval_dir: str | Path, tasks: list[str], aggregation: str = "all", seed: int = DEFAULT_SEED,
              kfold: int = 10, inner_folds: int = 5, log=print) -> dict:
    """Evaluates `encoder` (anything with ``encode(sentences) -> (n, dim)``) on `tasks`: one result per task,
    ``avg``/``avg_over`` (STS tests), ``transfer_avg``/``transfer_avg_over`` and ``seconds`` per task. A Ctrl-C
    ends the run early with the tasks that finished, ``interrupted`` naming the others."""
    results: dict = {}
    seconds: dict[str, float] = {}
    for index, task in enumerate(tasks):
        start = time.perf_counter()
        try:
            if task in STS_TASKS:
                results[task] = evaluate_sts_task(encoder.encode, load_sts_task(senteval_dir, task), aggregation)
                summary = f"spearman {results[task]['spearman']:.2f}  pearson {results[task]['pearson']:.2f}"
            else:
                results[task] = evaluate_transfer_task(encoder.encode, senteval_dir, task, seed, kfold, inner_folds)
                summary = f"accuracy {results[task]['accuracy']:.2f}"
        except KeyboardInterrupt:
            results["interrupted"] = tasks[index:]
            break
        seconds[task] = round(time.perf_counter() - start, 2)
        if log:
            log(f"{DISPLAY_NAMES[task]:>12}: {summary}  (n={results[task]['n']}, {seconds[task]:.1f}s)")
    for key, group, metric in (("avg", STS_TEST_TASKS, "spearman"), ("transfer_avg", TRANSFER_TASKS, "accuracy")):
        if ran := [t for t in group if t in results]:
            results[key] = float(sum(results[t][metric] for t in ran) / len(ran))
            results[f"{key}_over"] = ran
    results["seconds"] = seconds
    return results


def _cell(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def markdown_table(results: dict, label: str = "model") -> str:
    """Markdown tables for one model; see `markdown_tables`."""
    return markdown_tables({label: results})


def markdown_tables(rows: dict[str, dict]) -> str:
    """Markdown tables, one row per model (``{label: results}``), in the papers' column order:
    STS test sets (Spearman x100), other STS sets that ran, and transfer accuracies if any ran. An average over
    fewer tasks than its table's says how many, e.g. ``81.20 (5/7)``."""
    ran = {t for results in rows.values() for t in results}
    extras = tuple(t for t in STS_TASKS if t not in STS_TEST_TASKS and t in ran)
    transfer = TRANSFER_TASKS if ran.intersection(TRANSFER_TASKS) else ()
    tables = []
    for tasks, metric, average in ((STS_TEST_TASKS, "spearman", "avg"), (extras, "spearman", None),
                                   (transfer, "accuracy", "transfer_avg")):
        if not tasks:
            continue
        header = ["Model", *(DISPLAY_NAMES[t] for t in tasks), *(["Avg."] if average else [])]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for label, results in rows.items():
            cells = [label, *(_cell(results.get(t, {}).get(metric)) for t in tasks)]
            if average in results:
                over = len(results[f"{average}_over"])
                cells.append(_cell(results[average]) + ("" if over == len(tasks) else f" ({over}/{len(tasks)})"))
            elif average:
                cells.append("–")
            lines.append("| " + " | ".join(cells) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


@dataclass
class Encoder:
    """A loaded encoder: ``encode(sentences) -> (n, dim)`` float32 CPU tensor, plus a description."""

    path: str
    kind: str  # "mocose" | "sentence-transformers" | "hf"
    pooling: str  # the pooling used, or "sentence-transformers" for the folder's own modules
    model: "SentenceTransformer"  # noqa: F821 - imported when an encoder is loaded
    batch_size: int = 64
    show_progress: bool = True

    @property
    def max_length(self) -> int | None:
        """Truncation in tokens."""
        return self.model.max_seq_length

    def encode(self, sentences: list[str]) -> torch.Tensor:
        return self.model.encode(sentences, batch_size=self.batch_size, show_progress_bar=self.show_progress,
                                 convert_to_tensor=True).float().cpu()

    def describe(self) -> dict:
        return {"path": self.path, "kind": self.kind, "pooling": self.pooling, "max_length": self.max_length}


def detect_model_kind(path: str | Path) -> str:
    """``"mocose"`` (config.json model_type mocose), ``"sentence-transformers"`` (modules.json) or ``"hf"``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist; give a MoCoSE checkpoint, a sentence-transformers "
                                "folder or a Hugging Face encoder folder")
    if not path.is_dir():
        raise ValueError(f"model path {path} is a file; give the model folder")
    config = path / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except json.JSONDecodeError as err:
            raise ValueError(f"{config} is not valid JSON: {err}") from err
        if model_type == "mocose":
            return "mocose"
    if (path / "modules.json").is_file():
        return "sentence-transformers"
    if config.is_file():
        return "hf"
    raise ValueError(f"{path} is not a model folder: expected a MoCoSE checkpoint (config.json with \"model_type\": "
                     "\"mocose\"), a sentence-transformers folder (modules.json) or a Hugging Face encoder "
                     "(config.json)")


def load_encoder(path: str | Path, pooler: str | None = None, device: str | torch.device | None = None,
                 batch_size: int = 64, max_length: int | None = None, show_progress: bool = True,
                 truncate_dim: int | None = None) -> Encoder:
    """Loads the MoCoSE checkpoint, sentence-transformers folder or plain HF encoder folder `path`, in eval mode
    (float32 but for a sentence-transformers folder's own). `pooler` (``cls | cls_dense | mean``) overrides a MoCoSE
    checkpoint's sentence_pooling (plain HF default ``cls``); a sentence-transformers folder given one is read as a
    plain HF encoder. `device`: default CUDA when available. `max_length`: truncation in tokens, by default the
    encoder's own limit (whole sentences, as SentEval). `truncate_dim`: keep the embeddings' first N entries (a
    Matryoshka width), as `SentenceTransformer(path, truncate_dim=N)`; refused unless 1 <= N <= the model's width."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    if pooler is not None:
        check_sentence_pooling(pooler)
    device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kind = detect_model_kind(path)
    path = str(path)
    float32 = {"dtype": torch.float32}
    if kind == "sentence-transformers" and pooler is None:
        model = SentenceTransformer(path, device=device)
        if max_length:
            model.max_seq_length = max_length
        return Encoder(path, kind, "sentence-transformers", truncated(model, truncate_dim).eval(), batch_size,
                       show_progress)
    if kind == "mocose":
        model = SentenceTransformer(path, device=device, model_kwargs=float32)
        mocose = model[0].auto_model
        pooling = mocose.config.sentence_pooling = pooler or mocose.config.sentence_pooling  # `embed` reads it
        encoder_config = mocose.online_encoder.config
    else:  # a plain encoder, or a sentence-transformers folder's transformer weights read as one
        kind, pooling = "hf", pooler or "cls"
        transformer = Transformer(path, model_kwargs=float32)
        modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean" if pooling == "mean" else "cls")]
        if pooling == "cls_dense":
            if (dense := getattr(getattr(transformer.auto_model, "pooler", None), "dense", None)) is None:
                raise ValueError(f"--pooler cls_dense needs a pooler dense layer, and {path} has none")
            modules.append(Dense(dense.in_features, dense.out_features, activation_function=torch.nn.Identity(),
                                 init_weight=dense.weight.detach().clone(), init_bias=dense.bias.detach().clone()))
        model = SentenceTransformer(modules=modules, device=device)
        encoder_config = transformer.auto_model.config
    # Not sentence-transformers' own limit: see `resolve_max_length` (RoBERTa's offset, a MoCoSE config).
    model.max_seq_length = resolve_max_length(model.tokenizer, encoder_config, max_length)
    return Encoder(path, kind, pooling, truncated(model, truncate_dim).eval(), batch_size, show_progress)


def truncated(model, truncate_dim: int | None):
    """`model` encoding the first `truncate_dim` entries of its embeddings (None: as it is), after checking them."""
    if truncate_dim is None:
        return model
    width = model.get_embedding_dimension()
    if not (isinstance(truncate_dim, int) and 1 <= truncate_dim <= width):
        raise ValueError(f"--truncate_dim must be a whole number from 1 to the model's {width} dimensions, "
                         f"got {truncate_dim!r}.")
    model.truncate_dim = truncate_dim
    return model
