"""kotune/distill"""
