"""The methods' own pieces, apart from the model that uses them.

- `augmentation`: the views' word embeddings: token shuffle/cutoff (FGSM is in `models.objective`), and IFCL's
  fraternal word vectors (another model's table, lifted to the encoder's width).
- `una`: UNA's TF-IDF hard negatives (statistics and their cache, replacement probabilities, sampling).
- `mtd`: MoCoSE's maximum traceable distance (d_trace), its planner and the `hf-mocose mtd` command.

May import: nothing else from `hf_mocose` (torch, numpy, scipy and the standard library only); everything above
builds on it.
"""
