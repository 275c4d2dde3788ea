"""Shipped ONNX policies (package data) and the toy task they were trained on."""
