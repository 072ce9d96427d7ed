"""Distillation's nn parts: the soft-target, hidden-state and attention losses (loss.py), the student
built from a teacher (student.py), the teacher's cached logits (teacher_cache.py)."""
