from pathlib import Path

# The repository's top directory (tests/ is one level below it, whatever the test's folder).
REPO = Path(__file__).resolve().parent.parent
