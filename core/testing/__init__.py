"""Testing tools: a .tflite model builder, conformance cases, the pytest plugin, fetched real
models (``realmodels``) and where the shared example models are (``shared_models``)."""
