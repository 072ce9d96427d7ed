"""heads/distill"""
