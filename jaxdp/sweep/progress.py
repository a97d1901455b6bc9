"""The progress bar of candidates in training: the share done and the time, never a count.

How many candidates a private search trains is K, internal randomness that its
epsilon does not cover (`jaxdp.tuning.results.Unreleased`), so a bar shows the
percentage done, the elapsed time and an estimate of the rest, not "3/7".
Like every timing, a bar is for the user's own terminal: its steps and its
duration say something of K, and of the data where the data decide the work
(docs/guides/privacy.md: timing is not covered).
"""

from __future__ import annotations

from tqdm.auto import tqdm

#: tqdm's format of a bar without counts (`{n}`, `{total}` and rates left out).
BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"


def candidates_bar(total: int, progress: bool, desc: str = "candidates") -> tqdm:
  """A tqdm bar over `total` candidates (disabled unless `progress`) that shows no count."""
  return tqdm(total=total, disable=not progress, desc=desc, bar_format=BAR_FORMAT)
