"""The practice judge (``judgelib``) and its exercises; run it as ``python practice/judge.py``."""
