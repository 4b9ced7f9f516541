"""Mean, standard deviation and a paired t-test over seeds, with the t distribution computed here (the suite needs
torch alone): the regularised incomplete beta function by its continued fraction (Press et al., Numerical
Recipes, 3rd ed., section 6.4)."""

import math
from typing import Optional, Sequence, Tuple


def mean_sd(values: Sequence[float]) -> Tuple[float, float]:
    """The mean and the sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def paired_t_test(differences: Sequence[float]) -> Optional[float]:
    """The two-sided p-value that the mean of the per-seed ``differences`` is zero (None with fewer than two
    seeds, or every difference equal: no spread to test against)."""
    if len(differences) < 2:
        return None
    mean, sd = mean_sd(differences)
    if sd == 0.0:
        return None if mean == 0.0 else 0.0
    return t_two_sided_p(mean / (sd / math.sqrt(len(differences))), len(differences) - 1)
