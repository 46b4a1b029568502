"""Fortis."""
