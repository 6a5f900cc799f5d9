"""The views' augmentations, apart from the model that reads them.

- `views`: the word embeddings of a view: token shuffle/cutoff and feature cutoff (FGSM is in `models.objective`),
  IFCL's fraternal word vectors (another model's table, lifted to the encoder's width), ESimCSE's word repetition.
- `una`: UNA's TF-IDF hard negatives (statistics and their cache, replacement probabilities, sampling).

May import: nothing else from `hf_mocose` (torch, numpy, scipy and the standard library only); everything above
builds on it.
"""
