"""The engine's random draws: the lognormal of mean 1 its jitter factors follow."""
import math


def lognormal_params(cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean 1 and coefficient of variation ``cv``:
    sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2 (so E[e^X] = e^(mu + sigma^2/2) = 1)."""
    s2 = math.log1p(cv * cv)
    return -s2 / 2, math.sqrt(s2)
