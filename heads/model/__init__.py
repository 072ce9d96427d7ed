"""The model around the heads: KotuneModel (encoder + head, its save and load), encoder loading,
LoRA, layer mixing, the padding-free (packed) encoder call, documents as windows, the frozen feature
cache, embeddings, masked-LM pretraining, and the checks on a saved model's files."""
