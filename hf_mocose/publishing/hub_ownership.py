"""Which files of a Hub repo an hf-mocose push owns, so a push removes what the new upload no longer has.

A push adds and overwrites files; without deletions, files of an older upload survive it: after a
push where the encoder was saved sharded (`model.safetensors.index.json` + `model-0000N-of-0000M.safetensors`),
an older `model.safetensors` would stay beside the index and could be loaded instead of the new
weights. So every hf-mocose push is ONE commit that adds the new files and deletes, among the files it
**owns**, every one the new upload does not contain. It owns (`PushScope`):

- with `export_root`: the root files a sentence-transformers export of hf-mocose writes or has ever
  written (`EXPORT_ROOT_FILES`, the sharded-weight patterns `EXPORT_ROOT_PATTERNS`) and its module
  folders (`EXPORT_MODULE_FOLDERS`: `1_Pooling/`, `2_Dense/`), plus any top-level folder the new export has;
- `folders`: whole folders (`mocose/` for the final push, the checkpoint folder of a checkpoint push).

Never deleted, whatever the scope: `.gitattributes`, and `README.md` at any level (the card is replaced
when the export has one; without one the README may be the user's own). Anything else in the repo (a
user's own files and folders, `onnx/` or `openvino/` backend exports, other checkpoints) is not touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from posixpath import basename

# What `SentenceTransformer.save` of an hf-mocose export writes at the repo root (encoder, tokenizer and
# sentence-transformers files, for every tokenizer family and both weight formats), besides README.md.
EXPORT_ROOT_FILES = frozenset({
    "config.json", "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "chat_template.jinja",
})
# Sharded weights (`save_pretrained` with a `max_shard_size` the encoder exceeds).
EXPORT_ROOT_PATTERNS = ("model-*-of-*.safetensors", "pytorch_model-*-of-*.bin")
# The module folders `hf_mocose.publishing.export` builds (Transformer at the root -> Pooling -> Dense).
EXPORT_MODULE_FOLDERS = ("1_Pooling", "2_Dense")
NEVER_DELETED = (".gitattributes", "README.md")


@dataclass(frozen=True)
class PushScope:
    """The files of the repo one push owns (see the module docstring).

    Args:
        export_root: the push puts a sentence-transformers export at the repo root.
        folders: folders (paths in the repo, no trailing slash) the push owns wholly.
    """

    export_root: bool = False
    folders: tuple[str, ...] = ()

    def owns(self, path: str, uploaded_folders: frozenset[str] = frozenset()) -> bool:
        """Whether `path` (a file path in the repo) is this push's to replace or delete.

        `uploaded_folders`: the top-level folders the new upload has (owned too with `export_root`).
        """
        if basename(path) in NEVER_DELETED:
            return False
        if any(path.startswith(folder.strip("/") + "/") for folder in self.folders if folder.strip("/")):
            return True
        if not self.export_root:
            return False
        if "/" not in path:
            return path in EXPORT_ROOT_FILES or any(fnmatchcase(path, pattern) for pattern in EXPORT_ROOT_PATTERNS)
        top = path.split("/", 1)[0]
        return top in EXPORT_MODULE_FOLDERS or top in uploaded_folders


def stale_files(existing: Iterable[str], uploaded: Iterable[str], scope: PushScope) -> list[str]:
    """The files of `existing` (paths in the repo now) that `scope` owns and the new upload does not contain.

    These are what the push deletes, sorted. `uploaded`: the paths the push adds.
    """
    uploaded = set(uploaded)
    folders = frozenset(path.split("/", 1)[0] for path in uploaded if "/" in path)
    return sorted(path for path in set(existing) if path not in uploaded and scope.owns(path, folders))
