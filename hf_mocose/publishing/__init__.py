"""Publishing a trained model: the sentence-transformers export, its model card, and the Hub.

- `model_card`: what a card says, the run's facts collected while it trains (`card_facts.json`, written with every
  saved model and checkpoint) and the card's pieces (sentence-transformers' card data, evaluation results, citations,
  template); `card_hyperparameters` (the hyper-parameter rows).
- `export`: a MoCoSE checkpoint's online branch as a sentence-transformers folder, checked against
  `MoCoSEModel.embed`, with the card rendered from the facts.
- `hub`: uploads as one commit that deletes the stale files it owns, and what training publishes (the
  `MoCoSETrainer.push_to_hub` mixin).
- `commands`: the `hf-mocose export` and `hf-mocose push` sub-commands.

May import: `hf_mocose.models`, `hf_mocose.methods`, `hf_mocose.data`, `hf_mocose.training`. Never the front
ends (they import it), evaluation or the command line.
"""
