"""Stand-in IMEX executables for tests (see nvidia-imex / nvidia-imex-ctl here)."""
