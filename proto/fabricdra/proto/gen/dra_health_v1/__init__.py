"""Generated from proto/upstream by proto/generate.py; do not edit."""
