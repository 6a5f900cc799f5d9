"""Publishing a trained model: the sentence-transformers export, its model card, and the Hub.

- `export`: a MoCoSE checkpoint's online branch as a sentence-transformers folder, checked against `MoCoSEModel.embed`.
- `model_card` (layout, from the packaged template), `card_data` (sentence-transformers' card data on the loaded
  export, plus the model-index), `model_card_facts` (what a run's files say), `card_hyperparameters` (the
  hyper-parameter rows, `training_args.json`), `training_data_facts` (the training data, `training_data.json`).
- `hub` (Hub plumbing: repos, commits, dry runs), `hub_ownership` (which files a push owns, so deletes when its
  upload no longer has them), `hub_publishing` (what training publishes, in one commit; the
  `MoCoSETrainer.push_to_hub` mixin).
- `commands`: the `hf-mocose export` and `hf-mocose push` sub-commands.

May import: `hf_mocose.models`, `hf_mocose.methods`, `hf_mocose.data`, `hf_mocose.training`. Never the front
ends (they import it), evaluation or the command line.
"""
