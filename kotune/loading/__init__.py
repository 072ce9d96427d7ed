"""kotune/loading"""
