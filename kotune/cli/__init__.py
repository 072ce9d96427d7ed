"""kotune/cli"""
