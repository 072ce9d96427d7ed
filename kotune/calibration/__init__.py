"""A model's confidence after training: train.calibrate's temperature or Platt fit (calibration/fit.py)
and predict.min_confidence's abstention (calibration/abstention.py)."""
