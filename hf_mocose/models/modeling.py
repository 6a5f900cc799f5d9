"""`MoCoSEModel`: the online and target branches, their heads and the key queue, in one `PreTrainedModel`.

Layout (method "mocose"; [CLS] is the masked mean of the token states instead for `sentence_pooling="mean"`):

    online:  word embeddings (+ FGSM delta) -> online_encoder -> [CLS] -> online_pooler -> online_projection
             -> predictor = query
    target:  same word embeddings (detached) -> target_encoder -> [CLS] -> target_pooler -> target_projection = key

The target branch is an EMA copy of the online one (`EMATargetCallback`) that reads the online word embeddings
(its encoder keeps a 1-row placeholder table); with `shared_embeddings="module"` (the paper's Figure 2) the rest
of the embedding module is copied after every step instead of averaged. The queue and the target are persistent
state, so `save_pretrained` / `from_pretrained` restore a run exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel

from .branches import ContrastiveBranches, Encoders, MoCoSEOutput
from .configuration import MODEL_CONFIG_FIELDS, MoCoSEConfig
from .ema import EMATensorPairs, ema_tensor_pairs, local_shards
from .encoder_init import (CONFIG_LOCATION_KWARGS, build_encoder, check_is_encoder, load_pretrained_encoder,
                           set_encoder_dropout, start_from_pretrained)
from .heads import init_head_weights
from .pooling import pool_sentence_embedding

__all__ = ["MoCoSEModel", "MoCoSEOutput"]
# `ContrastiveBranches` field -> the module's name in `MoCoSEModel` (the names of its saved weights).
BRANCH_MODULE_NAMES = {"pooler": "online_pooler", "projection": "online_projection", "predictor": "predictor",
                       "target_encoder": "target_encoder", "target_pooler": "target_pooler",
                       "target_projection": "target_projection", "queue": "queue"}


class MoCoSEModel(PreTrainedModel):
    """A MoCoSE (or SimCSE-mode) sentence encoder with everything training needs.

    Build one around a plain encoder with `MoCoSEModel.from_pretrained("bert-base-uncased")` (or
    `from_encoder`); reload a MoCoSE checkpoint with the same call. `embed` gives the sentence
    embedding used for evaluation and export."""

    config_class = MoCoSEConfig
    base_model_prefix = "mocose"
    supports_gradient_checkpointing = True
    # forward() takes no **kwargs, so the Trainer scales the loss for gradient accumulation itself.
    accepts_loss_kwargs = False

    def __init__(self, config: MoCoSEConfig):
        super().__init__(config)
        set_encoder_dropout(config.encoder_config, config.encoder_dropout)
        self.online_encoder = build_encoder(config.encoder_config)
        branches = ContrastiveBranches.build(config, config.hidden_size, self._build_target_encoder)
        for field, name in BRANCH_MODULE_NAMES.items():
            if getattr(branches, field) is not None:
                setattr(self, name, getattr(branches, field))
        if config.fraternal_vocab_size:
            # IFCL: a second (e.g. other-language) model's word embeddings for the fraternal view; frozen.
            self.fraternal_embeddings = nn.Embedding(config.fraternal_vocab_size, config.hidden_size)
            self.fraternal_embeddings.requires_grad_(False)
        self.post_init()
        self.copy_online_to_target()

    def _build_target_encoder(self) -> nn.Module:
        encoder = build_encoder(self.config.encoder_config)
        encoder.set_input_embeddings(nn.Embedding(1, self.config.hidden_size))  # shared: see module docstring
        return encoder

    @property
    def branches(self) -> ContrastiveBranches:
        """The heads, target and queue as `ContrastiveBranches` (a view of this model's modules)."""
        return ContrastiveBranches(self.config, **{field: getattr(self, name, None)
                                                   for field, name in BRANCH_MODULE_NAMES.items()})

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_encoder(cls, encoder_name_or_path: str | PreTrainedModel, fraternal_model_name_or_path: str | None = None,
                     **config_kwargs) -> "MoCoSEModel":
        """Builds a fresh MoCoSE model around a pretrained encoder (a folder, Hub id or loaded model, whose dtype
        it takes; the queue stays fp32). Both encoders start as it, the pooler from its pooler when it has one.
        `config_kwargs` are `MoCoSEConfig` fields; `fraternal_model_name_or_path` (IFCL) gives the fraternal table."""
        pretrained, encoder_config, name = load_pretrained_encoder(encoder_name_or_path)
        fraternal = None
        if fraternal_model_name_or_path is not None:
            from ..augmentation.views import fraternal_word_vectors

            hidden = getattr(encoder_config, "hidden_size", None) or encoder_config.dim
            fraternal = fraternal_word_vectors(AutoModel.from_pretrained(fraternal_model_name_or_path), hidden,
                                               str(fraternal_model_name_or_path))
            config_kwargs["fraternal_vocab_size"] = fraternal.shape[0]
        model = cls(MoCoSEConfig(encoder_config=encoder_config, **config_kwargs))
        if fraternal is not None:
            with torch.no_grad():
                model.fraternal_embeddings.weight.copy_(fraternal)
        start_from_pretrained(model, pretrained, name, match_dtype=isinstance(encoder_name_or_path, PreTrainedModel))
        return model

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """Loads a MoCoSE checkpoint (`subfolder="mocose"` of a published repo too), or builds a fresh model
        around a plain encoder: `MODEL_CONFIG_FIELDS` keywords configure it, the others (`dtype`, float32 by
        default as in TRL, `revision`...) go to `AutoModel.from_pretrained`. A checkpoint keeps its config."""
        overrides = {k: kwargs.pop(k) for k in (*MODEL_CONFIG_FIELDS, "fraternal_model_name_or_path") if k in kwargs}
        if kwargs.get("config") is None:
            location = {k: kwargs[k] for k in CONFIG_LOCATION_KWARGS if k in kwargs}
            probe = AutoConfig.from_pretrained(pretrained_model_name_or_path, **location)
            if probe.model_type != MoCoSEConfig.model_type:
                check_is_encoder(probe, str(pretrained_model_name_or_path))
                kwargs.setdefault("dtype", torch.float32)  # a fresh model trains in float32 unless asked (as TRL)
                encoder = AutoModel.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
                return cls.from_encoder(encoder, **overrides)
        overrides.pop("fraternal_model_name_or_path", None)  # a checkpoint keeps its own fraternal table
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model.keep_queue_in_fp32()  # also when loaded with another `dtype`
        if changed := {k: v for k, v in overrides.items() if getattr(model.config, k) != v}:
            from transformers.utils import logging

            logging.get_logger(__name__).warning(f"{pretrained_model_name_or_path} is a MoCoSE checkpoint; its own "
                                                 f"config wins over {changed}.")
        return model

    def keep_queue_in_fp32(self) -> None:
        """Returns the queue to fp32 after a cast of the whole model (`dtype=...`), as `KeyQueue` expects."""
        if self.config.uses_queue and self.queue.keys.dtype != torch.float32:
            self.queue.float()

    def _init_weights(self, module: nn.Module) -> None:
        init_head_weights(module, getattr(self.config.encoder_config, "initializer_range", 0.02))

    # ----------------------------------------------------------------- word embeddings
    def get_input_embeddings(self) -> nn.Module:
        """The online encoder's word embeddings `(V, H)`, the table both branches read (FSDP2 shards it alone)."""
        return self.online_encoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Replaces the online encoder's word embeddings; the target branch reads them through `inputs_embeds`."""
        self.online_encoder.set_input_embeddings(value)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Resizes the shared word embeddings to `new_num_tokens` rows and records it in `config.encoder_config`
        so the saved model reloads (the target's 1-row placeholder stays)."""
        embeddings = self.online_encoder.resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.config.encoder_config.vocab_size = self.online_encoder.config.vocab_size
        return embeddings

    def head_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters of the online heads (pooler, projection, predictor), not the encoder's."""
        return [p for module in self.branches.online_heads() for p in module.parameters() if p.requires_grad]

    # ----------------------------------------------------------------- target branch
    def target_modules(self) -> list[nn.Module]:
        """The modules of the target branch (empty for methods without one)."""
        return self.branches.target_modules()

    def ema_parameter_pairs(self) -> EMATensorPairs:
        """`EMATensorPairs` of both branches (with `shared_embeddings="module"` the embedding module's are copied)."""
        shared = self.online_encoder.get_input_embeddings().weight
        copied_online, copied_target = self._shared_embedding_module_tensors()
        online_p, target_p, online_b, target_b = self.branches.ema_parameter_pairs(self.online_encoder,
                                                                                   skip=[shared, *copied_online])
        return EMATensorPairs(online_p, target_p, online_b + copied_online, target_b + copied_target)

    def _shared_embedding_module_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """With `shared_embeddings="module"`: the embedding module's online and target parameters (words aside)."""
        if not self.config.uses_target or self.config.shared_embeddings != "module":
            return [], []
        word = self.online_encoder.get_input_embeddings()
        path = next((name for name, module in self.online_encoder.named_modules()
                     if any(child is word for child in module.children())), "")
        if not path:
            raise ValueError(f"shared_embeddings='module' needs an encoder whose word embeddings sit in an embedding "
                             f"module (as BERT's `embeddings`); {type(self.online_encoder).__name__} keeps them at "
                             "its top level: use shared_embeddings='word'.")
        pairs = ema_tensor_pairs([(self.online_encoder.get_submodule(path), self.target_encoder.get_submodule(path))],
                                 skip=[word.weight])
        return pairs.online_params, pairs.target_params

    @torch.no_grad()
    def copy_online_to_target(self) -> None:
        """Makes the target branch an exact copy of the online one (own storage, not shared)."""
        if not self.config.uses_target or self.online_pooler.weight.is_meta:
            return
        online_p, target_p, online_b, target_b = self.ema_parameter_pairs()
        torch._foreach_copy_(local_shards(target_p + target_b), local_shards(online_p + online_b))

    def train(self, mode: bool = True) -> "MoCoSEModel":
        super().train(mode)
        self.branches.set_training(mode)  # the target without dropout unless `target_dropout`
        return self

    # ----------------------------------------------------------------- forward
    def _encode_sentence(self, encoder, inputs_embeds, attention_mask, token_type_ids) -> torch.Tensor:
        """`(B, H)` the state the heads read: [CLS], or the masked token mean for `sentence_pooling="mean"` (so a
        model kept on mean pooling, as all-MiniLM-L6-v2, trains on the state it is used with)."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = encoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask, **extra).last_hidden_state
        return pool_sentence_embedding(hidden, attention_mask, "mean" if self.config.sentence_pooling == "mean" else "cls")

    def _encoder(self, encoder: nn.Module, augmentation=None):
        """An `Encode` for `ContrastiveBranches`: inputs `(word embeddings (B, L, H), mask, token types)`, FGSM's
        delta added, then the view's `augmentation`, then `encoder` reading them as `inputs_embeds`."""
        def encode(inputs, perturbation):
            embeddings, mask, types = inputs
            words = embeddings if perturbation is None else embeddings + perturbation
            view = words if augmentation is None else augmentation(words, mask)
            return self._encode_sentence(encoder, view, mask, types), words
        return encode

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, embedding_perturbation: torch.Tensor | None = None,
                perturb_target: bool = True,
                online_augmentation: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                key_augmentation: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                negative_input_ids: torch.Tensor | None = None, negative_attention_mask: torch.Tensor | None = None,
                negative_token_type_ids: torch.Tensor | None = None, fraternal_input_ids: torch.Tensor | None = None,
                fraternal_attention_mask: torch.Tensor | None = None, positive_input_ids: torch.Tensor | None = None,
                positive_attention_mask: torch.Tensor | None = None,
                positive_token_type_ids: torch.Tensor | None = None, negatives_as_anchors: bool = False,
                inputs_embeds: torch.Tensor | None = None) -> MoCoSEOutput:
        """Runs both views of a batch (and its hard negatives, if any) through `ContrastiveBranches`.

        Args:
            input_ids, attention_mask, token_type_ids: `(B, L)`.
            embedding_perturbation: `(B, L, H)` added to the online word embeddings (FGSM), or None.
            perturb_target: whether the target branch sees the perturbation too.
            online_augmentation, key_augmentation: `f(embeddings (B, L, H), attention_mask (B, L)) -> (B, L, H)`
                on the query's / the key's word embeddings (token shuffle / cutoff), drawn independently.
            negative_input_ids, negative_attention_mask, negative_token_type_ids: `(U, L')` hard negatives,
                encoded like keys.
            fraternal_input_ids, fraternal_attention_mask: `(B, L)` IFCL's fraternal text in the fraternal
                vocabulary, fused position by position with the anchor.
            positive_input_ids, positive_attention_mask, positive_token_type_ids: `(B, L'')` a given positive
                (a paraphrase, ESimCSE's word-repeated copy) the key is computed from instead of the sentence itself.
            negatives_as_anchors: the hard negatives are anchors too (`negative_queries`: UNA as in its paper).
            inputs_embeds: `(B, L, H)` the online word embeddings, looked up by the caller so that FGSM gets
                their gradient under `torch_compile`.
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        embed_tokens = self.online_encoder.get_input_embeddings()
        clean = embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        target = getattr(self, "target_encoder", None)
        encoders = Encoders(self._encoder(self.online_encoder, online_augmentation),
                            self._encoder(self.online_encoder, key_augmentation),
                            None if target is None else self._encoder(target, key_augmentation),
                            None if target is None else self._encoder(target))

        def given(ids, mask, types):  # a positive or hard negatives: the word embeddings of other text
            return None if ids is None else (embed_tokens(ids), mask, types)

        output = self.branches.forward(
            encoders, (clean, attention_mask, token_type_ids),
            given(positive_input_ids, positive_attention_mask, positive_token_type_ids), embedding_perturbation,
            perturb_target, given(negative_input_ids, negative_attention_mask, negative_token_type_ids),
            negatives_as_anchors)
        if inputs_embeds is not None:
            output.fgsm_gradient_at = inputs_embeds
        if fraternal_input_ids is not None:
            self._fraternal_view(output, fraternal_input_ids, fraternal_attention_mask, attention_mask)
        return output

    def _fraternal_view(self, output: MoCoSEOutput, ids, fraternal_mask, anchor_mask) -> None:
        """IFCL: encodes epsilon * y + (1 - epsilon) * y_fraternal, fused position by position."""
        if not self.config.fraternal_vocab_size:
            raise ValueError("fraternal inputs were given but the model has no fraternal embeddings "
                             "(build it with fraternal_model_name_or_path).")
        if ids.shape != anchor_mask.shape:
            raise ValueError(f"fraternal_input_ids {tuple(ids.shape)} must have the anchor's shape {tuple(anchor_mask.shape)}.")
        epsilon = self.config.fraternal_fusion
        fused = epsilon * output.word_embeddings + (1.0 - epsilon) * self.fraternal_embeddings(ids)
        mask = torch.maximum(anchor_mask, fraternal_mask)
        output.fraternal_query = self.branches.online_key(self._encode_sentence(self.online_encoder, fused, mask, None))
        output.input_embeddings = torch.stack([pool_sentence_embedding(output.word_embeddings, anchor_mask, "mean"),
                                               pool_sentence_embedding(fused, mask, "mean")])

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The sentence embedding `(B, H)`: online encoder + `config.sentence_pooling`."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        hidden = self.online_encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        return pool_sentence_embedding(hidden, attention_mask, self.config.sentence_pooling, self.online_pooler)
    get_text_features = embed  # what sentence-transformers calls: SentenceTransformer(checkpoint) encodes as `embed`


AutoModel.register(MoCoSEConfig, MoCoSEModel, exist_ok=True)  # AutoModel and SentenceTransformer load checkpoints
