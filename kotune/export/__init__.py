"""Export: a saved kotune model as the architecture's native transformers class (native.py) or an
ONNX Runtime directory (onnx.py), each a registered export format, and the model card written
with every export (model_card.py)."""
