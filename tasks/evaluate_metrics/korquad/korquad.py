"""kotune's korquad metric family as an evaluate module: see tasks/evaluate_metrics/__init__.py."""
import evaluate

from tasks.evaluate_metrics import KotuneMetric


class Korquad(KotuneMetric, evaluate.Metric):
    family = "korquad"
