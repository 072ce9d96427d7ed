"""kotune/inference"""
