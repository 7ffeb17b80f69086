# Shared pytest setup: make `harness` importable for every test directory.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
