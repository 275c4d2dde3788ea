# SPDX-License-Identifier: Apache-2.0
"""Shipped ONNX policies (package data)."""
