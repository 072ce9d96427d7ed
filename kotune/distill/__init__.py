"""action=distill: the teacher as saved (distill/teacher.py), the student and the cached teacher
logits (distill/distillation.py), the distillation Trainer (distill/trainer.py); its loss and
student builder are nn code in heads/distill/."""
