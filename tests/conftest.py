import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MPLBACKEND", "Agg")
