"""Heads: ``nn.Module`` s on the encoder's hidden states; they never see text. Each head class carries
its contract (heads/base.py); the registry, kind → class, is ``heads.registry.HEADS`` (imported apart,
so that reading a checkpoint's JSON (heads/model/artifact.py) does not load torch). The model around
them (KotuneModel, encoder loading, LoRA, layer mixing, the feature cache, masked-LM) is heads/model/.

A head takes ``(hidden_states, attention_mask, **extra_inputs)`` and returns logits (a tensor or
a tuple); ``head.loss(logits, **labels)`` gives the batch's mean loss, ``loss_sums`` and
``loss_counts`` the same as sums and item counts, so that training divides by the counts of a whole
optimizer step (heads/loss.py); ``label_fields`` names the batch keys that hold labels.
"""
