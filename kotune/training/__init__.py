"""kotune/training"""
