"""kotune/calibration"""
