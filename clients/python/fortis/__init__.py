"""Fortis: robustness testing of image-recognition services (IEEE Std 3129-2023)."""

__version__ = "0.1.0"
