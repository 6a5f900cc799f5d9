"""Publishing a trained model: the sentence-transformers export, its model card, and the Hub.

- `export`: a MoCoSE checkpoint's online branch as a sentence-transformers folder, checked against `MoCoSEModel.embed`.
- `model_card` (layout and metadata, from the packaged template), `model_card_facts` (what a run's files say).
- `hub` (Hub plumbing: repos, commits, dry runs), `hub_publishing` (what training publishes, in one commit;
  the `MoCoSETrainer.push_to_hub` mixin).
- `commands`: the `hf-mocose export` and `hf-mocose push` sub-commands.

May import: `hf_mocose.models`, `hf_mocose.methods`, `hf_mocose.data`, `hf_mocose.training`. Never the front
ends (they import it), evaluation or the command line.
"""
