"""Cost model: predict the nine ledgers and the memory ledger from a configuration (LEDGERS.md, "Predicted
cost"), calibrate it from a trace, and compare with what attribution measured."""
from .config import ConfigError, load_config
from .predict import Prediction, predict, predict_file

__all__ = ["ConfigError", "load_config", "Prediction", "predict", "predict_file"]
