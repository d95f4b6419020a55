"""Built-in reward modules; importing this package registers them."""

from polyrl.rewards.builtins.accuracy import Accuracy, Format
from polyrl.rewards.builtins.cider import Cider
from polyrl.rewards.builtins.drawing import Drawing
from polyrl.rewards.builtins.fluency import PerplexityFluency
from polyrl.rewards.builtins.length import Length
from polyrl.rewards.builtins.reasoning_gym import ReasoningGymScore
from polyrl.rewards.builtins.rouge import RougeL
from polyrl.rewards.builtins.safety import DEFAULT_CATEGORIES, Safety, SafetyDetails, SafetyFinding
from polyrl.rewards.builtins.text import CJKTokenizer, tokenize

__all__ = [
    "Accuracy",
    "CJKTokenizer",
    "Cider",
    "DEFAULT_CATEGORIES",
    "Drawing",
    "Format",
    "Length",
    "PerplexityFluency",
    "ReasoningGymScore",
    "RougeL",
    "Safety",
    "SafetyDetails",
    "SafetyFinding",
    "tokenize",
]
