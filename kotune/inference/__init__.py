"""Prediction and the one results schema (inference/predict.py), and what runs a loaded model's
batches (inference/model_runtimes.py)."""
