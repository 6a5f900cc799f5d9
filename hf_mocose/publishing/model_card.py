"""What a model card says: the run's facts, collected while it trains, and the card's pieces (card data, results...).

A MoCoSE card is written at export, maybe later, offline, when the trainer and its data are gone. So `MoCoSETrainer`
describes its training set when it starts (`describe_training_data`) and, from the Trainer's own save hook, writes the
run's facts with every model and checkpoint it saves (`save_card_facts`, `card_facts.json`). Nothing is unpickled:
`training_args.bin` would run code from the file. `export.render_model_card` renders the card from the facts
(`training_details`), `MoCoSEModelCardData` and the template (`find_template`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from itertools import islice
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformerModelCardData

from ..training.checkpoints import list_checkpoints
from .card_hyperparameters import as_record, model_rows, training_rows

CARD_FACTS_JSON = "card_facts.json"
STS_TEST_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
TRANSFER_TASKS = ("mr", "cr", "subj", "mpqa", "sst2", "trec", "mrpc")
TASK_NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16", "stsb": "STS-B",
              "sickr": "SICK-R", "stsb_dev": "STS-B dev", "mr": "MR", "cr": "CR", "subj": "SUBJ", "mpqa": "MPQA",
              "sst2": "SST-2", "trec": "TREC", "mrpc": "MRPC"}
TRAINING_LOSS, STSB_DEV = "Training Loss", "STS-B dev Spearman"
STATS_ROWS, SAMPLE_ROWS = 1000, 3  # token statistics over the first 1000 sentences (sentence-transformers: 100)


def describe_training_data(dataset, tokenizer, max_seq_length: int) -> dict[str, Any] | None:
    """The card's description of `dataset` (raw `text` and/or tokenised `input_ids`), or None: `{"sentences": N or
    None (a stream), "columns", "token_lengths": {"min", "mean", "max", "rows", "max_seq_length", "longer"},
    "samples", "samples_from_tokens"}`, token lengths as training saw them (`longer`: rows cut; None without text)."""
    columns = list(getattr(dataset, "column_names", None) or [])
    if dataset is None or not ({"text", "input_ids"} & set(columns)):
        return None
    size = len(dataset) if hasattr(dataset, "__len__") else None
    # An IterableDataset's first rows are read again on every pass: nothing is consumed.
    first = dataset.select(range(min(STATS_ROWS, size))) if size is not None else list(islice(iter(dataset), STATS_ROWS))
    rows = {name: [row[name] for row in first] for name in columns if name in ("text", "input_ids")}
    texts = None if rows.get("text") is None else [text or "" for text in rows["text"]]
    longer = None
    if texts is not None:  # tokenised once, whole: training's lengths are these cut at max_seq_length
        whole = [len(ids) for ids in tokenizer(texts, truncation=False, verbose=False)["input_ids"]]
        longer = sum(length > max_seq_length for length in whole)
    lengths = [len(ids) for ids in rows["input_ids"]] if "input_ids" in rows else [
        min(length, max_seq_length) for length in whole]
    if not lengths:
        return None
    samples = list(texts[:SAMPLE_ROWS]) if texts is not None else [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in rows["input_ids"][:SAMPLE_ROWS]]
    return {"sentences": size, "columns": [c for c in ("text", "positive_text") if c in columns] or ["text"],
            "token_lengths": {"min": min(lengths), "mean": round(sum(lengths) / len(lengths), 2), "max": max(lengths),
                              "rows": len(lengths), "max_seq_length": max_seq_length, "longer": longer},
            "samples": samples, "samples_from_tokens": texts is None}


def state_facts(state: dict[str, Any]) -> dict[str, Any]:
    """The card's facts of a `TrainerState` (its `vars`, or a `trainer_state.json`): the steps, the wall time, the
    best step (`best_global_step`, else `best_model_checkpoint`'s) and the logs table, one row per logged step
    (`Epoch`, `Step`, `Training Loss`, `STS-B dev Spearman` x100, 4 decimals, merged when a step has both)."""
    rows: list[dict[str, Any]] = []
    for entry in state.get("log_history") or []:
        values = {TRAINING_LOSS: entry.get("loss"), STSB_DEV: entry.get("eval_stsb_spearman")}
        values = {key: round(float(value), 4) for key, value in values.items() if isinstance(value, (int, float))}
        if not values or entry.get("step") is None:
            continue
        if rows and rows[-1]["Step"] == entry["step"]:
            rows[-1].update(values)
        else:
            rows.append({"Epoch": round(float(entry.get("epoch") or 0), 4), "Step": entry["step"], **values})
    best, checkpoint = state.get("best_global_step"), str(state.get("best_model_checkpoint") or "").rstrip("/")
    if best is None and checkpoint.rsplit("-", 1)[-1].isdigit():
        best = int(checkpoint.rsplit("-", 1)[-1])
    runtimes = [entry["train_runtime"] for entry in state.get("log_history") or [] if "train_runtime" in entry]
    return {"global_step": state.get("global_step"), "max_steps": state.get("max_steps"),
            "train_runtime": runtimes[-1] if runtimes else None, "log_rows": rows, "best_step": best}


def card_facts(trainer) -> dict[str, Any]:
    """The card's facts of a live run (see the module), as `save_card_facts` writes them; the hardware is
    'N x <GPU name>' or 'N x CPU process(es)'."""
    import torch
    world = getattr(trainer.args, "world_size", 1)
    return {"training_args": as_record(trainer.args), "training_data": getattr(trainer, "training_data", None),
            **state_facts(vars(trainer.state)), "global_batch_size": getattr(trainer, "global_batch_size", None),
            "hardware": f"{world} x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else
            f"{world} x CPU process" + ("es" if world > 1 else "")}


def save_card_facts(folder: str | os.PathLike, trainer) -> Path:
    """Writes `card_facts(trainer)` to `folder`/card_facts.json; `MoCoSETrainer` calls it wherever it saves a model
    or checkpoint (main process), so `hf-mocose export` of any of them writes the card without the run."""
    path = Path(folder) / CARD_FACTS_JSON
    facts = json.dumps(card_facts(trainer), indent=2, sort_keys=True, ensure_ascii=False, default=str)
    path.write_text(facts + "\n", encoding="utf-8")
    return path


def _read_json(path: Path | None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _find_in_run(checkpoint: Path, name: str) -> Path | None:
    """`name` in the checkpoint, else in its parent output dir, else in the parent's latest checkpoint-N."""
    newest_first = reversed(list_checkpoints(checkpoint.parent))
    return next((folder / name for folder in (checkpoint, checkpoint.parent, *newest_first) if (folder / name).is_file()),
                None)


def load_card_facts(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The facts `save_card_facts` wrote for `checkpoint` (in it, its run folder or the run's latest checkpoint);
    for an older one, from its `training_args.json`, `training_data.json` and `trainer_state.json`."""
    checkpoint = Path(checkpoint)
    saved = _read_json(_find_in_run(checkpoint, CARD_FACTS_JSON))
    if isinstance(saved, dict):
        return saved
    record = _read_json(_find_in_run(checkpoint, "training_args.json")) or {}
    data = _read_json(_find_in_run(checkpoint, "training_data.json"))
    return {"training_args": record, **state_facts(_read_json(_find_in_run(checkpoint, "trainer_state.json")) or {}),
            "training_data": data if isinstance(data, dict) and isinstance(data.get("token_lengths"), dict) else None,
            "pickle_only": not record and _find_in_run(checkpoint, "training_args.bin") is not None}


def public_name(value: Any) -> Any:
    """A local path (absolute, relative or existing here) as its file name: a card never shows a machine's folders."""
    if isinstance(value, str) and "/" in value.replace(os.sep, "/") and (
            os.path.isabs(value) or value.startswith((".", "~")) or os.path.exists(value)):
        return Path(value).name
    return value


def training_details(config: dict[str, Any], facts: dict[str, Any], training_args: Any | None = None) -> dict:
    """The template's `details`: the run's `facts` with the checkpoint `config`'s, the hyper-parameter rows, the
    global batch size B (per device x accumulation x processes; one process assumed when unrecorded) and d_trace."""
    recorded = as_record(facts.get("training_args") if training_args is None else training_args)
    method, world_size, batch = config.get("method", "mocose"), recorded.get("world_size"), facts.get("global_batch_size")
    batch_assumed = batch is None and world_size is None
    if batch is None and "per_device_train_batch_size" in recorded:
        batch = (recorded["per_device_train_batch_size"] * (recorded.get("gradient_accumulation_steps") or 1)
                 * (world_size or 1))
    d_trace = None
    if method == "mocose" and "ema_decay_end" in recorded and batch:
        from ..methods.mtd import max_traceable_distance

        d_trace = max_traceable_distance(recorded["ema_decay_end"], config.get("queue_size", 512), batch)
    runtime = facts.get("train_runtime")
    minutes, seconds = divmod(round(runtime or 0), 60)
    hours, minutes = divmod(minutes, 60)
    return {
        **state_facts({}), **facts, "method": method, "model_rows": model_rows(config),
        "train_rows": training_rows(recorded),
        "all_arguments": {k: public_name(v) for k, v in sorted((recorded.get("arguments") or {}).items())},
        "global_batch_size": batch, "batch_assumed": batch_assumed,
        "d_trace": None if d_trace is None else ("∞ (η_end = 1)" if math.isinf(d_trace) else f"{d_trace:.2f}"),
        "train_runtime": None if runtime is None else (f"{hours}h {minutes:02d}m {seconds:02d}s" if hours
                                                       else f"{minutes}m {seconds:02d}s"),
        "trained_with_transformers": config.get("transformers_version"),
        "una_used": recorded.get("hard_negatives") == "una",  # an explicit switch: una_alpha has a non-zero default
        # Checkpoints before base_model_name_or_path existed: the encoder's own record.
        "base_model": config.get("base_model_name_or_path") or (config.get("encoder_config") or {}).get("_name_or_path"),
        "training_max_seq_length": config.get("max_seq_length"), "sentence_pooling": config.get("sentence_pooling", "cls"),
        "queue_size": config.get("queue_size"), "best_exported": bool(recorded.get("load_best_model_at_end")),
    }


def read_eval_results(source: str | os.PathLike | dict | None) -> dict[str, Any]:
    """Normalises an evaluation JSON (path or dict) to `{"sts": {task: {...}}, "transfer": {...}, "avg": x, ...}`:
    the `hf-mocose evaluate` format (`{"sts12": {"spearman", "pearson", "n"}, ..., "mr": {"accuracy"}, "avg"}`), the
    same nested under "sts"/"transfer"/"results", or the trainer's metrics (`eval_stsb_spearman` -> STS-B dev).
    Each STS task: `{"spearman", "pearson", "n", "spearman_all"}`."""
    raw = source if isinstance(source, dict) else {}
    if source is not None and not isinstance(source, dict):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"Evaluation results file {str(path)!r} does not exist.")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Evaluation results file {str(path)!r} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ValueError(f"Evaluation results must be a JSON object, got {type(raw).__name__}.")
    nested = ("results", "sts", "transfer", "tasks")
    flat = {k: v for key in nested if isinstance(raw.get(key), dict) for k, v in raw[key].items()}
    flat.update({k: v for k, v in raw.items() if k not in nested})
    if "eval_stsb_spearman" in flat and "stsb_dev" not in flat:
        flat["stsb_dev"] = {"spearman": flat["eval_stsb_spearman"], "pearson": flat.get("eval_stsb_pearson")}
    sts, transfer = {}, {}
    for task in (*STS_TEST_TASKS, "stsb_dev"):
        value = {"spearman": flat[task]} if isinstance(flat.get(task), (int, float)) else flat.get(task)
        if isinstance(value, dict) and isinstance(value.get("spearman"), (int, float)):
            sts[task] = {k: value.get(k) for k in ("spearman", "pearson", "n")}
            # Over all pairs (MTEB's score, `eval_results.py`); None when only a weighted mean of sets was kept.
            one_set = task in ("stsb", "sickr", "stsb_dev") or value.get("aggregation", "all") == "all"
            sts[task]["spearman_all"] = (value["all"] if isinstance(value.get("all"), dict) else value if one_set
                                         else {}).get("spearman")
    for task in TRANSFER_TASKS:
        value = flat.get(task)
        accuracy = value.get("accuracy", value.get("acc")) if isinstance(value, dict) else value
        if isinstance(accuracy, (int, float)):
            transfer[task] = float(accuracy)
    avg = flat.get("avg", flat.get("sts_avg"))
    avg = avg.get("spearman") if isinstance(avg, dict) else avg
    # `avg_over` (hf-mocose evaluate) says which STS tasks the average covers; a partial average
    # must not be labelled, or compared with the paper, as the 7-task one.
    avg_over = flat.get("avg_over") or [t for t in STS_TEST_TASKS if t in sts]
    if not isinstance(avg, (int, float)) and all(t in sts for t in STS_TEST_TASKS):
        avg, avg_over = sum(sts[t]["spearman"] for t in STS_TEST_TASKS) / len(STS_TEST_TASKS), list(STS_TEST_TASKS)
    complete = set(STS_TEST_TASKS) <= set(avg_over)
    transfer_avg = flat.get("transfer_avg")
    return {"sts": sts, "transfer": transfer, "avg": float(avg) if isinstance(avg, (int, float)) else None,
            "avg_complete": complete, "avg_label": "Average (7 STS)" if complete else
            "Average over " + ", ".join(TASK_NAMES.get(t, t) for t in avg_over),
            "transfer_avg": float(transfer_avg) if isinstance(transfer_avg, (int, float)) else None}


DEFAULT_TEMPLATE = "mocose.md.j2"
CITATIONS = {
    "mocose": """@inproceedings{cao-etal-2022-exploring,
    title = "Exploring the Impact of Negative Samples of Contrastive Learning: A Case Study of Sentence Embedding",
    author = "Cao, Rui and Wang, Yihao and Liang, Yuxin and Gao, Ling and Zheng, Jie and Ren, Jie and Wang, Zheng",
    booktitle = "Findings of the Association for Computational Linguistics: ACL 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
}""",
    "simcse": """@inproceedings{gao-etal-2021-simcse,
    title = "{S}im{CSE}: Simple Contrastive Learning of Sentence Embeddings",
    author = "Gao, Tianyu and Yao, Xingcheng and Chen, Danqi",
    booktitle = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing",
    year = "2021",
    publisher = "Association for Computational Linguistics",
}""",
    "ifcl": """@inproceedings{xiao-li-chen-2023-ifcl,
    title = "Identical and Fraternal Twins: Fine-Grained Semantic Contrastive Learning of Sentence Representations",
    author = "Xiao, Qingfa and Li, Shuangyin and Chen, Lei",
    booktitle = "Proceedings of the 26th European Conference on Artificial Intelligence (ECAI 2023)",
    year = "2023",
}""",
    "esimcse": """@inproceedings{wu-etal-2022-esimcse,
    title = "{ESimCSE}: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding",
    author = "Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin",
    booktitle = "Proceedings of the 29th International Conference on Computational Linguistics",
    year = "2022",
    publisher = "International Committee on Computational Linguistics",
}""",
    "una": """@misc{shu-lampos-una,
    title = "Unsupervised hard Negative Augmentation for contrastive learning",
    author = "Shu, Yuxuan and Lampos, Vasileios",
    year = "2024",
    note = "arXiv preprint",
}""",
}


def mocose_eval_results(results: dict[str, Any]) -> list:
    """`EvalResult`s of `read_eval_results`' dict as `EmbeddingSimilarityEvaluator` names them on every sentence-
    transformers model: `spearman_cosine` / `pearson_cosine` in [-1, 1] ("Semantic Similarity"); transfer `accuracy`."""
    from huggingface_hub import EvalResult
    sts = dict(task_type="semantic-similarity", task_name="Semantic Similarity")
    evals = [EvalResult(**sts, dataset_type=task, dataset_name=f"{TASK_NAMES[task]} (SentEval)",
                        dataset_split="validation" if task == "stsb_dev" else "test", metric_type=f"{metric}_cosine",
                        metric_name=f"{metric.capitalize()} Cosine", metric_value=round(float(scores[metric]) / 100, 6))
             for task, scores in results["sts"].items() for metric in ("spearman", "pearson")
             if scores.get(metric) is not None]
    if results["avg"] is not None:
        evals.append(EvalResult(**sts, dataset_type="sts-avg" if results["avg_complete"] else "sts-partial-avg",
                                dataset_name=f"{results['avg_label']} (SentEval)", dataset_split="test",
                                metric_type="spearman_cosine", metric_name="Spearman Cosine",
                                metric_value=round(results["avg"] / 100, 6)))
    return evals + [EvalResult(task_type="text-classification", task_name="SentEval transfer", dataset_type=task,
                               dataset_name=f"{TASK_NAMES[task]} (SentEval)", metric_type="accuracy",
                               metric_name="Accuracy", metric_value=round(accuracy / 100, 6))
                    for task, accuracy in results["transfer"].items()]


@dataclass
class MoCoSEModelCardData(SentenceTransformerModelCardData):
    """`SentenceTransformerModelCardData` plus a model-index from an evaluation JSON (`eval_results`);
    `local_path_snippet`: the usage snippet loads a local folder (`model_id`), it downloads nothing."""

    eval_results: list = field(default_factory=list)  # huggingface_hub EvalResult, see `mocose_eval_results`
    local_path_snippet: bool = False

    def to_dict(self) -> dict[str, Any]:
        from huggingface_hub.repocard_data import eval_results_to_model_index
        data = super().to_dict()  # also cached for `to_yaml`, which reads the same dict
        if self.eval_results:
            data["model-index"] = eval_results_to_model_index(self.model_name, self.eval_results)
            data["metrics"] = list(dict.fromkeys(result.metric_type for result in self.eval_results))
        return data

    def generate_usage_snippet(self) -> str:
        snippet = super().generate_usage_snippet()
        return snippet.replace("# Download from the 🤗 Hub\n", "# Load the model folder\n") if self.local_path_snippet \
            else snippet


def training_data_tables(training_data: dict[str, Any] | None) -> dict[str, str] | None:
    """The card's statistics and samples tables of the training data, as sentence-transformers draws them
    (columns = the data's columns, cells through its own example formatting)."""
    from sentence_transformers.base.model_card import BaseModelCardData
    from transformers.modelcard import make_markdown_table
    if not training_data:
        return None
    lengths, column = training_data["token_lengths"], training_data["columns"][0]
    details = (f"<ul><li>min: {lengths['min']} tokens</li><li>mean: {lengths['mean']} tokens</li>"
               f"<li>max: {lengths['max']} tokens</li></ul>")
    stats = make_markdown_table([{"": "type", column: "string"}, {"": "details", column: details}])
    samples = make_markdown_table([{column: f"<code>{BaseModelCardData._format_example_value(text)}</code>"}
                                   for text in training_data["samples"]])
    return {"stats_table": stats.replace("-:|", "--|"), "examples_table": samples.replace("-:|", "--|")}


def find_template(template: str | os.PathLike | None = None) -> Path:
    """The card template: `template` if it is a file, else that name (default `mocose.md.j2`)
    in the repository's `model_cards/` folder (source checkouts) or the installed package data."""
    if template is not None and Path(template).is_file():
        return Path(template)
    name = DEFAULT_TEMPLATE if template is None else str(template)
    candidates = [Path(__file__).resolve().parents[2] / "model_cards" / name,
                  Path(str(resources.files("hf_mocose") / "templates" / name))]
    if (found := next((candidate for candidate in candidates if candidate.is_file()), None)) is None:
        raise FileNotFoundError(f"Model card template {name!r} not found (looked in: {', '.join(map(str, candidates))}).")
    return found


def as_list(value) -> list:
    """None -> [], a string -> [that string] (one tag, not its characters), a list or tuple -> a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


# transformers' `create_model_card` name -> the `render_model_card` argument with the same meaning (ours came first).
_SAME_MEANING = {"finetuned_from": "base_model", "dataset_tags": "datasets", "dataset": "corpus"}


def card_kwargs_from_trainer_keywords(**kwargs) -> dict[str, Any]:
    """Maps `Trainer.create_model_card`'s keywords onto `render_model_card`'s (`_SAME_MEANING`); `tasks` become
    tags (the `pipeline_tag` stays sentence-similarity). Both names of one thing with different values are a
    `ValueError` naming both."""
    card = dict(kwargs)
    for trainer_name, ours in _SAME_MEANING.items():
        if (value := card.pop(trainer_name, None)) is None:
            continue
        value = ", ".join(as_list(value)) if ours == "corpus" else (as_list(value) if ours == "datasets" else value)
        if card.get(ours) not in (None, (), []) and card[ours] != value:
            raise ValueError(f"{trainer_name}={kwargs[trainer_name]!r} and {ours}={card[ours]!r} say the same thing "
                             "differently: give one of them.")
        card[ours] = value
    return {name: as_list(value) if name in ("tags", "tasks", "dataset_args") else value for name, value in card.items()}
