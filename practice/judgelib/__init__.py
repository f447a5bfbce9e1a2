"""The practice judge (see practice/judge.py)."""
