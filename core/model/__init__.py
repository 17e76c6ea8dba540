"""Reading ``.tflite`` files: checked flatbuffer access, validation, load-time folding."""
from .reader import load_model

__all__ = ["load_model"]
