"""
=====================================================
Pipelines, grid search and cross-validation on 3-D X
=====================================================

The estimators take 3-D sequence arrays ``(n_samples, n_tokens, d)`` wherever scikit-learn expects
``X``. Here a noisy two-head linear attention generates the targets; we

1. choose the ridge penalty ``alpha`` of :class:`~sklearn_linattn.LinearAttentionRegressor` by
   :class:`~sklearn.model_selection.GridSearchCV`,
2. compare it by :func:`~sklearn.model_selection.cross_val_score` with a pipeline of
   :class:`~sklearn_linattn.LinearAttentionFeatures` and an ordinary scikit-learn regressor,
3. plot the cross-validated R^2 against ``alpha``.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor, mhla_forward

rng = np.random.default_rng(0)
d, n_heads = 4, 2
V = rng.normal(size=(n_heads, 1, d)) / np.sqrt(d)
Q = rng.normal(size=(n_heads, d, d)) / np.sqrt(d)

# Variable-length sequences: trailing all-NaN tokens are padding.
X = rng.normal(size=(300, 12, d))
lengths = rng.integers(4, 13, size=300)
X[np.arange(12)[None, :] >= lengths[:, None]] = np.nan
y_clean = mhla_forward(X, V, Q)[:, 0]
y = y_clean + 0.3 * y_clean.std() * rng.normal(size=300)

# %%
# Grid search over the ridge penalty
# ----------------------------------
cv = KFold(5, shuffle=True, random_state=0)
alphas = np.logspace(-3, 4, 15)
search = GridSearchCV(LinearAttentionRegressor(), {"alpha": alphas}, cv=cv).fit(X, y)
print("best alpha:", search.best_params_["alpha"])
print("best cross-validated R^2: %.3f" % search.best_score_)

# %%
# The cubic features in an ordinary scikit-learn pipeline
# -------------------------------------------------------
pipe = make_pipeline(LinearAttentionFeatures(), StandardScaler(), RidgeCV(np.logspace(-3, 4, 15)))
pipe_scores = cross_val_score(pipe, X, y, cv=cv)
print("features + scaler + RidgeCV: R^2 = %.3f +- %.3f" % (pipe_scores.mean(), pipe_scores.std()))

# %%
# Cross-validated R^2 against alpha
# ---------------------------------
mean = search.cv_results_["mean_test_score"]
std = search.cv_results_["std_test_score"]
fig, ax = plt.subplots(figsize=(6, 4))
ax.semilogx(alphas, mean, marker="o", label="LinearAttentionRegressor")
ax.fill_between(alphas, mean - std, mean + std, alpha=0.2)
ax.axhline(pipe_scores.mean(), color="k", ls="--", label="features + RidgeCV pipeline")
ax.set_xlabel("alpha")
ax.set_ylabel("cross-validated R$^2$")
ax.set_title("Choosing the ridge penalty on noisy sequences")
ax.legend()
fig.tight_layout()
plt.show()
