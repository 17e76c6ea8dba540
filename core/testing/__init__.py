"""Testing tools: a .tflite model builder, conformance cases, and the pytest plugin."""
