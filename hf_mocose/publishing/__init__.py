"""Publishing a trained model: the sentence-transformers export, its model card, and the Hub.

- `card_facts`: the run's facts, collected while it trains (`card_facts.json`, written with every saved model and
  checkpoint).
- `model_card`: `MoCoSEModelCardData`, the export's card, filled from those facts and rendered from its template;
  `card_hyperparameters` (the hyper-parameter rows).
- `export`: a MoCoSE checkpoint's online branch as a sentence-transformers folder, checked, with the card.
- `runtimes`: its ONNX, int8 ONNX and OpenVINO files, each checked against PyTorch and measured for the card;
  `runtime_speed` (how: the encode loop around any runtime, interleaved timing, the card's advice).
- `eval_results`: the Hub's `.eval_results/*.yaml` of its STS scores (MTEB's dataset ids).
- `hub`: uploads as one commit that deletes the stale files it owns, and what training publishes.
- `commands`: the `hf-mocose export` and `hf-mocose push` sub-commands.

May import: `models`, `augmentation`, `data`, `launch`, `metrics`. Never the front ends (they import it), evaluation or the CLI.
"""
