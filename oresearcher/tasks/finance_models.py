"""Models of the finance case study: a tabular Transformer, a volatility LSTM, GARCH(1,1).

- :class:`TabularTransformer`: feature tokens + attention, after the FT-Transformer
  (Gorishniy et al., "Revisiting Deep Learning Models for Tabular Data", NeurIPS 2021):
  every input column j becomes a token ``x_j * W_j + b_j`` ([B, F, d]), a learned [CLS]
  token is prepended, pre-norm Transformer encoder layers attend across features, and a
  linear head on [CLS] gives two logits (deny, approve).
- :class:`VolatilityLSTM`: returns window [B, W, 1] -> LSTM -> last hidden state ->
  linear -> softplus: next-period realised volatility (percent per day, > 0).
- :func:`garch_forecast`: the classical baseline, GARCH(1,1) with a constant mean and
  normal errors (Bollerslev 1986), fitted by the ``arch`` package on the training window
  only; its parameters then filter the whole series and give, for each test day t, the
  forecast sqrt(mean of the h = 1..HORIZON step variance forecasts): the same target the
  LSTM predicts. ``arch`` is optional (``pip install -e .[finance]``).
"""
from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .finance_data import HORIZON, INSTALL_HINT

log = logging.getLogger(__name__)


class TabularTransformer(nn.Module):
    def __init__(self, n_features: int, d: int = 16, heads: int = 2, layers: int = 1, ff: int = 32):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_features, d) * d ** -0.5)  # [F, d]
        self.bias = nn.Parameter(torch.zeros(n_features, d))
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, F] -> logits [B, 2]
        tokens = x.unsqueeze(-1) * self.weight + self.bias  # [B, F, d]
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1)  # [B, 1+F, d]
        return self.head(self.norm(self.encoder(tokens)[:, 0]))


class VolatilityLSTM(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, W, 1] -> [B]
        out, _ = self.lstm(x)
        return F.softplus(self.head(out[:, -1])).squeeze(-1)


def have_arch() -> bool:
    try:
        import arch  # noqa: F401
    except ImportError:
        return False
    return True


GARCH_SKIP = f"GARCH(1,1) baseline skipped: the arch package is not installed ({INSTALL_HINT})"


def garch_forecast(returns: np.ndarray, train_end: int, days: np.ndarray, horizon: int = HORIZON) -> np.ndarray:
    """Forecast realised volatility after each of ``days`` (indices into ``returns``,
    percent log returns) from GARCH(1,1) fitted on ``returns[:train_end]``. [len(days)]."""
    from arch import arch_model

    fitted = arch_model(returns[:train_end], mean="Constant", vol="GARCH", p=1, q=1, dist="normal",
                        rescale=False).fit(disp="off")
    fixed = arch_model(returns, mean="Constant", vol="GARCH", p=1, q=1, dist="normal", rescale=False)
    res = fixed.fix(fitted.params)
    start = int(days.min())
    var = res.forecast(horizon=horizon, start=start, reindex=False).variance.to_numpy()  # [D-start, H]
    return np.sqrt(var[days - start].mean(1))


def garch_test_rmse() -> float | None:
    """RMSE of the GARCH(1,1) forecast on the S&P 500 test days (the volatility task's
    classical baseline); None, with :data:`GARCH_SKIP` logged as a warning, without the arch package."""
    from .finance_data import load_sp500

    if not have_arch():
        log.warning(GARCH_SKIP)
        return None
    d = load_sp500()
    pred = garch_forecast(d.returns, d.train_end, d.day["test"].numpy())
    return float(np.sqrt(np.mean((pred - d.y["test"].numpy()) ** 2)))


def historical_test_rmse() -> float:
    """RMSE of the naive forecast on the test days: the realised volatility of the input
    window itself."""
    from .finance_data import load_sp500

    d = load_sp500()
    hist = np.sqrt(np.mean(d.X["test"].numpy()[:, :, 0] ** 2, 1)) * d.returns[:d.train_end].std()
    return float(np.sqrt(np.mean((hist - d.y["test"].numpy()) ** 2)))
